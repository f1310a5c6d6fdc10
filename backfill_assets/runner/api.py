"""The runner's one entry for the CLI: what ``run``, ``launch``, ``import``, ``verify``,
``evaluate``, ``check``, the deadline plan and the canary do, and the Dagster objects they need.

The CLI imports this module inside the command that uses it, never at start-up: it brings in
Dagster and the provider stack. The ledger queries that need neither are ``queries``.
"""

from __future__ import annotations

from backfill_assets.accelerators.check_executions import CHECK_STATES
from backfill_assets.defs.asset_keys import BLOCKING_GROUPS, POLICY_EVALUATION
from backfill_assets.defs.labels.applied import write_back
from backfill_assets.defs.labels.checks import check_status, verdicts_for
from backfill_assets.defs.model_resources import OpenAIModelResource, model_resource, versions_for
from backfill_assets.defs.partitions import ensure_partitions, partition_key_for, partition_ref
from backfill_assets.defs.reporting.evaluation import (
    comparison,
    evaluate_policies,
    evaluation_metadata,
    gate_evaluation,
    gate_verdict,
    gold_sha256,
    store_gold,
)
from backfill_assets.defs.reporting.usage import REPRICE_COLUMNS, USAGE_COLUMNS, reprice, usage_csv
from backfill_assets.defs.resources import RunResource
from backfill_assets.demo.generate import write_export
from backfill_assets.dispatch.partition_run import PartitionRef, RunStopped
from backfill_assets.dispatch.pipeline import run_partitions, with_levels
from backfill_assets.ingest.gold import GoldError, read_gold
from backfill_assets.ingest.importer import (
    ImportInputError,
    ImportOptions,
    export_files,
    import_files,
)
from backfill_assets.platform_db.sink import SinkError, check, ddl, gap_partitions
from backfill_assets.platform_db.sql_import import SqlImport, SqlSource, import_sql
from backfill_assets.runner.canary import run_sample
from backfill_assets.runner.deadline_plan import NoLimitKnown, plan_deadline
from backfill_assets.runner.deadline_run import carry_out, utc
from backfill_assets.runner.instance import instance
from backfill_assets.runner.launch import (
    DONE_STATUSES,
    DagsterClient,
    GraphQLError,
    by_tenant,
    select_partitions,
)
from backfill_assets.runner.orchestrate import record_import, refresh
from backfill_assets.runner.plan import make_plan
from backfill_assets.runner.pooling import Plan, pool_by_region
from backfill_assets.runner.processes import run_plan
from backfill_assets.runner.run_records import RunRecord
from backfill_assets.runner.verification import verify_store
from backfill_assets.wiring import PLAN_JOB, USAGE_JOB, build_definitions

__all__ = [
    "BLOCKING_GROUPS",
    "CHECK_STATES",
    "DONE_STATUSES",
    "PLAN_JOB",
    "POLICY_EVALUATION",
    "REPRICE_COLUMNS",
    "USAGE_COLUMNS",
    "USAGE_JOB",
    "DagsterClient",
    "GoldError",
    "GraphQLError",
    "ImportInputError",
    "ImportOptions",
    "NoLimitKnown",
    "OpenAIModelResource",
    "PartitionRef",
    "Plan",
    "RunRecord",
    "RunResource",
    "RunStopped",
    "SinkError",
    "SqlImport",
    "SqlSource",
    "build_definitions",
    "by_tenant",
    "carry_out",
    "check",
    "check_status",
    "comparison",
    "ddl",
    "ensure_partitions",
    "evaluate_policies",
    "evaluation_metadata",
    "export_files",
    "gap_partitions",
    "gate_evaluation",
    "gate_verdict",
    "gold_sha256",
    "import_files",
    "import_sql",
    "instance",
    "make_plan",
    "model_resource",
    "partition_key_for",
    "partition_ref",
    "plan_deadline",
    "pool_by_region",
    "read_gold",
    "record_import",
    "refresh",
    "reprice",
    "run_partitions",
    "run_plan",
    "run_sample",
    "select_partitions",
    "store_gold",
    "usage_csv",
    "utc",
    "verdicts_for",
    "verify_store",
    "versions_for",
    "with_levels",
    "write_back",
    "write_export",
]
