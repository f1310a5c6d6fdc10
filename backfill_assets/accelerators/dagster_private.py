"""Every name this project takes from Dagster's private modules, in one place, with the reason.

Dagster 1.13 has no public API for these; the pin (``dagster==1.13.27``) and the tests that use
them (the embedded instance, the plan, the checks) catch a move on upgrade. Import them from
here, never from ``dagster._*`` elsewhere.
"""

from __future__ import annotations

# A check evaluation's pointer to the checked materialisation, which AssetCheckResult would fill
# in for a single-partition step; our checks report for many partitions of one run.
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData as TargetMaterialization,
)

# The tag a materialisation carries its code version in: the plan reads it from the instance's
# latest materialisations to find stale partitions without a per-partition status query.
from dagster._core.definitions.data_version import CODE_VERSION_TAG

# ``event_json.py`` writes the metadata field as Dagster's serde for it does (see below).
from dagster._core.definitions.metadata import MetadataFieldSerializer

# ``compute_logs.py`` captures a run's output as Dagster's local compute log manager does,
# into the same files, mirroring it with a thread instead of ``tail`` processes.
from dagster._core.execution.compute_logs import redirect_to_file, should_disable_io_stream_redirect

# A range run's per-partition metadata goes straight to the step's accumulator, keyed by this
# handle (``step_metadata.py``): the public method lists the run's range a call.
from dagster._core.execution.context.metadata_logging import AssetMetadataHandle

# The embedded instance's event log (``sqlite_event_log.py``) subclasses Dagster's SQLite
# storage to keep its shards' connections open: these are the classes and constants it extends;
# the instance classes (``instance_class.py``) start from Dagster's defaults (``InstanceRef``).
from dagster._core.instance.ref import InstanceRef, compute_logs_directory
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.compute_log_manager import CapturedLogContext, ComputeIOType

# Any instance's event log (its type: ``check_executions.check_states`` reads its checks), and
# the tables of Dagster's SQL ones.
from dagster._core.storage.event_log.base import EventLogStorage
from dagster._core.storage.event_log.schema import (
    AssetCheckExecutionsTable,
    SqlEventLogStorageTable,
)

# Every Dagster event log here is SQL: the apply reads which checks did not block in its run
# from the check-execution rows (``check_executions.unblocked_in_run``), and the checks their
# target materialisations from the event rows (``event_rows.py``), through its index
# connection.
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    INDEX_SHARD_NAME,
    SqliteEventLogStorage,
)
from dagster._core.storage.local_compute_log_manager import (
    IO_TYPE_EXTENSION,
    LocalComputeLogManager,
)

# ``schema_facts.py`` remembers the SQL run storage's answers about its own schema.
from dagster._core.storage.runs.sql_run_storage import SqlRunStorage
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._core.storage.sqlite_storage import DagsterSqliteStorage, _event_logs_directory

# The backfill daemon sleeps this module's ``DEFAULT_DAEMON_INTERVAL_SECONDS`` (30 s) between
# its looks at the backfills, read when its loop starts; 1.13.27 has no setting for it
# (``instance_class.py`` shortens it on request). Dagster loads the module with the instance.
from dagster._daemon import controller as daemon_controller
from dagster._serdes import ConfigurableClassData, serialize_value
from dagster._utils import ensure_file, touch_file

# The production event log (``pg_event_log.py``) subclasses Dagster's PostgreSQL storage the same
# way: the stock classes, the event rows' table, and how the storage reads its config.
from dagster_postgres import DagsterPostgresStorage, PostgresEventLogStorage, PostgresRunStorage
from dagster_postgres.utils import get_token_provider_from_config, pg_url_from_config

# ``event_json.py`` packs events as Dagster's serialiser does, faster: it reads each class's
# serde from Dagster's whitelist, and a record's fields as Dagster's serde reads them.
from dagster_shared.check.record import is_record
from dagster_shared.record import _REMAPPING_FIELD as RECORD_REMAP_FIELD
from dagster_shared.serdes.serdes import (
    _WHITELIST_MAP,
    EMPTY_VALUES_TO_SKIP,
    EnumSerializer,
    NamedTupleSerializer,
)

__all__ = [
    "CODE_VERSION_TAG",
    "EMPTY_VALUES_TO_SKIP",
    "INDEX_SHARD_NAME",
    "IO_TYPE_EXTENSION",
    "RECORD_REMAP_FIELD",
    "SQLITE_BUSY_TIMEOUT_SECONDS",
    "WHITELIST_MAP",
    "AssetCheckExecutionRecordStatus",
    "AssetCheckExecutionsTable",
    "AssetMetadataHandle",
    "CapturedLogContext",
    "ComputeIOType",
    "ConfigurableClassData",
    "DagsterPostgresStorage",
    "DagsterSqliteStorage",
    "EnumSerializer",
    "EventLogStorage",
    "InstanceRef",
    "LocalComputeLogManager",
    "MetadataFieldSerializer",
    "NamedTupleSerializer",
    "PostgresEventLogStorage",
    "PostgresRunStorage",
    "SqlEventLogStorage",
    "SqlEventLogStorageTable",
    "SqlRunStorage",
    "SqliteEventLogStorage",
    "TargetMaterialization",
    "compute_logs_directory",
    "daemon_controller",
    "ensure_file",
    "event_logs_directory",
    "get_token_provider_from_config",
    "is_record",
    "pg_url_from_config",
    "redirect_to_file",
    "serialize_value",
    "should_disable_io_stream_redirect",
    "touch_file",
]

event_logs_directory = _event_logs_directory
WHITELIST_MAP = _WHITELIST_MAP
