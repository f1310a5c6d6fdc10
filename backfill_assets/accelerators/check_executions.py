"""Rows of Dagster's ``asset_check_executions`` table, as Dagster 1.13 writes them, cheaper.

A run's planned check event makes one row a partition, each holding the serialised event
(with the run's whole partition subset in it): Dagster serialises the event again for every
row, 500 times in a run of 500 partitions, and compiles a multi-row ``VALUES`` anew. Each
evaluation then updates its partition's row, with the event serialised again and the statement
built again. Both instance event logs (``sqlite_instance.py``, ``pg_instance.py``) write the
same rows through these: the planned event serialised once and inserted with one statement
compiled once (on PostgreSQL, its body sent once for all the rows: ``planned_columns``), the
update's parameters (``evaluated_params``) given the body the evaluation's
event row was written with. SQLite runs ``EVALUATED`` with them as an executemany; PostgreSQL,
whose driver runs an executemany a round trip a row, one UPDATE joined to a VALUES list of
them, in ``EVALUATED_PARAMS`` order.

The apply reads which checks did not block in its own run from these rows
(``unblocked_in_run``): one indexed query, where loading the run's evaluation events
deserialised 500 of them a run, and Dagster's per-partition check status joins each
partition's latest materialisation (0.7 s a query on PostgreSQL at 10,000 partitions). Only a
failed evaluation's body is read, to tell a blocking failure from a non-blocking one
(``blocked``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import sqlalchemy as sa

from backfill_assets.accelerators.dagster_private import (
    AssetCheckExecutionRecordStatus,
    AssetCheckExecutionsTable,
    EventLogStorage,
    SqlEventLogStorage,
    serialize_value,
)
from backfill_assets.accelerators.event_rows import VALUES_PER_QUERY

_T = AssetCheckExecutionsTable.c
# Dagster's update of a partition's planned row by its evaluation.
EVALUATED = (
    AssetCheckExecutionsTable.update()
    .where(
        sa.and_(
            _T.asset_key == sa.bindparam("b_asset_key"),
            _T.check_name == sa.bindparam("b_check_name"),
            _T.run_id == sa.bindparam("b_run_id"),
            _T.partition == sa.bindparam("b_partition"),
        )
    )
    .values(
        execution_status=sa.bindparam("b_status"),
        evaluation_event=sa.bindparam("b_body"),
        evaluation_event_timestamp=sa.bindparam("b_timestamp"),
        evaluation_event_storage_id=sa.bindparam("b_event_id"),
        materialization_event_storage_id=sa.bindparam("b_target_id"),
    )
)
PLANNED = AssetCheckExecutionsTable.insert()
# ``evaluated_params``' keys, in the order of a VALUES list of them (``pg_instance.py``).
EVALUATED_PARAMS = (
    "b_asset_key",
    "b_check_name",
    "b_run_id",
    "b_partition",
    "b_status",
    "b_body",
    "b_timestamp",
    "b_event_id",
    "b_target_id",
)


def insert_timestamp(event: dg.EventLogEntry) -> datetime:
    """Dagster's ``_event_insert_timestamp`` (untyped there): UTC without a zone."""
    return datetime.fromtimestamp(event.timestamp, UTC).replace(tzinfo=None)


def planned_columns(
    event: dg.EventLogEntry, event_id: int | None
) -> tuple[dict[str, Any], list[Any]]:
    """A planned check event's rows as the columns they share (the body serialised once) and
    the partition key of each row (``[None]``: one unpartitioned row)."""
    planned: Any = event.get_dagster_event().event_specific_data
    subset = planned.partitions_subset
    partition_keys = subset.get_partition_keys() if subset is not None else [None]
    shared = dict(
        asset_key=planned.asset_key.to_string(),
        check_name=planned.check_name,
        run_id=event.run_id,
        execution_status=AssetCheckExecutionRecordStatus.PLANNED.value,
        evaluation_event=serialize_value(event),
        evaluation_event_timestamp=insert_timestamp(event),
        evaluation_event_storage_id=event_id,
    )
    return shared, list(partition_keys)


def planned_rows(event: dg.EventLogEntry, event_id: int | None) -> list[dict[str, Any]]:
    """The rows of a planned check event (one a partition, or one unpartitioned), for
    ``PLANNED`` as an executemany."""
    shared, partition_keys = planned_columns(event, event_id)
    return [dict(shared, partition=partition_key) for partition_key in partition_keys]


def batchable(event: dg.EventLogEntry) -> bool:
    """An evaluation ``EVALUATED`` can write: of a partition, in a run (the others go
    Dagster's own way: an unpartitioned row, a runless evaluation)."""
    evaluation: Any = event.get_dagster_event().event_specific_data
    return evaluation.partition is not None and bool(event.run_id)


def evaluated_params(event: dg.EventLogEntry, body: str, event_id: int | None) -> dict[str, Any]:
    """``EVALUATED``'s parameters for a ``batchable`` evaluation whose event row holds
    ``body`` under ``event_id``."""
    evaluation: Any = event.get_dagster_event().event_specific_data
    target = evaluation.target_materialization_data
    return {
        "b_asset_key": evaluation.asset_key.to_string(),
        "b_check_name": evaluation.check_name,
        "b_run_id": event.run_id,
        "b_partition": evaluation.partition,
        "b_status": (
            AssetCheckExecutionRecordStatus.SUCCEEDED.value
            if evaluation.passed
            else AssetCheckExecutionRecordStatus.FAILED.value
        ),
        "b_body": body,
        "b_timestamp": insert_timestamp(event),
        "b_event_id": event_id,
        "b_target_id": target.storage_id if target else None,
    }


def blocked(body: str | None) -> bool:
    """Whether a failed evaluation, stored as ``body``, blocked ``applied_labels``: failed at
    ERROR severity with ``blocking`` set (Dagster's gate). One group holds every check, so an
    evaluation that failed only on spend or drift does not block (``check_defs.CheckGroup``);
    one written before that kept its spec's ``blocking`` and does. A body that does not parse
    counts as blocked."""
    try:
        entry = dg.deserialize_value(body or "", dg.EventLogEntry)
        evaluation = entry.get_dagster_event().event_specific_data
    except Exception:
        return True
    if not isinstance(evaluation, dg.AssetCheckEvaluation):
        return True
    return (
        not evaluation.passed
        and bool(evaluation.blocking)
        and evaluation.severity == dg.AssetCheckSeverity.ERROR
    )


def unblocked_in_run(
    storage: SqlEventLogStorage, asset_key: dg.AssetKey, check_names: Sequence[str], run_id: str
) -> dict[str, set[str]]:
    """Each partition's checks of ``check_names`` whose evaluation in ``run_id`` did not block:
    passed, or failed on non-blocking members only (the rows' unique index is asset, check,
    run, partition; only a failed row's body is read)."""
    failed = AssetCheckExecutionRecordStatus.FAILED.value
    query = sa.select(
        _T.partition,
        _T.check_name,
        sa.case((_T.execution_status == failed, _T.evaluation_event), else_=None),
    ).where(
        _T.asset_key == asset_key.to_string(),
        _T.check_name.in_(list(check_names)),
        _T.run_id == run_id,
        _T.partition.isnot(None),
        _T.execution_status.in_([AssetCheckExecutionRecordStatus.SUCCEEDED.value, failed]),
    )
    out: dict[str, set[str]] = {}
    with storage.index_connection() as conn:
        for partition, check_name, body in conn.execute(query):
            if body is None or not blocked(body):
                out.setdefault(partition, set()).add(check_name)
    return out


# What a partition's latest evaluation of a check says (``check_states``; ``check --summary``).
CHECK_STATES = ("passed", "failed", "failed, not blocking", "older", "never ran")
# The states of a partition whose check does not hold it back.
UNBLOCKED_STATES = frozenset({"passed", "failed, not blocking"})


def check_states(
    storage: EventLogStorage, check_key: dg.AssetCheckKey, partition_keys: Sequence[str]
) -> dict[str, str]:
    """Each of ``partition_keys`` that has a row for ``check_key``: its latest evaluation as
    one of ``CHECK_STATES``. ``older``: of an earlier materialisation; ``never ran``: planned
    or skipped, not evaluated; ``failed, not blocking``: failed on spend or drift alone (the
    labels were applied). Partitions without a row are left out. Dagster's partition info a
    chunk of keys, and the bodies of the current failures only."""
    out: dict[str, str] = {}
    failed: list[tuple[str, str]] = []
    for i in range(0, len(partition_keys), VALUES_PER_QUERY):
        chunk = list(partition_keys[i : i + VALUES_PER_QUERY])
        for info in storage.get_asset_check_partition_info([check_key], partition_keys=chunk):
            if info.partition_key is None:
                continue
            status = info.latest_execution_status.value
            state = {"SUCCEEDED": "passed", "FAILED": "failed"}.get(status, "never ran")
            if state != "never ran" and not info.is_current:
                state = "older"
            elif state == "failed":
                failed.append((info.latest_planned_run_id, info.partition_key))
            out[info.partition_key] = state
    if failed and isinstance(storage, SqlEventLogStorage):
        for pk in _unblocking_failures(storage, check_key, failed):
            out[pk] = "failed, not blocking"
    return out


def _unblocking_failures(
    storage: SqlEventLogStorage, check_key: dg.AssetCheckKey, latest: Sequence[tuple[str, str]]
) -> set[str]:
    """Of ``latest`` (a partition's failed evaluation of ``check_key``, as (run id,
    partition)), the partitions whose evaluation did not block; by the unique index, a
    chunk of pairs a query."""
    out: set[str] = set()
    failed = AssetCheckExecutionRecordStatus.FAILED.value
    with storage.index_connection() as conn:
        for i in range(0, len(latest), 400):
            query = sa.select(_T.partition, _T.evaluation_event).where(
                _T.asset_key == check_key.asset_key.to_string(),
                _T.check_name == check_key.name,
                sa.tuple_(_T.run_id, _T.partition).in_(list(latest[i : i + 400])),
                _T.execution_status == failed,
            )
            out |= {partition for partition, body in conn.execute(query) if not blocked(body)}
    return out
