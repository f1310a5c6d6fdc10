"""Rows of Dagster's ``asset_check_executions`` table, as Dagster 1.13 writes them, cheaper.

A run's planned check event makes one row a partition, each holding the serialised event
(with the run's whole partition subset in it): Dagster serialises the event again for every
row, 500 times in a run of 500 partitions, and compiles a multi-row ``VALUES`` anew. Each
evaluation then updates its partition's row, with the event serialised again and the statement
built again. Both instance event logs (``sqlite_event_log.py``, ``pg_event_log.py``) write the
same rows through these: the planned event serialised once and inserted with one statement
compiled once (on PostgreSQL, its body sent once for all the rows: ``planned_columns``), the
update's parameters (``evaluated_params``) given the body the evaluation's
event row was written with. SQLite runs ``EVALUATED`` with them as an executemany; PostgreSQL,
whose driver runs an executemany a round trip a row, one UPDATE joined to a VALUES list of
them, in ``EVALUATED_PARAMS`` order.

On the instances whose event log is one of these, the product (``defs/instance_api.py``) reads
from these rows too. The apply reads which checks did not block in its own run
(``unblocked_in_run``): one indexed query, where loading the run's evaluation events
deserialised 500 of them a run, and Dagster's per-partition check status joins each
partition's latest materialisation (0.7 s a query on PostgreSQL at 10,000 partitions). Only a
failed evaluation's body is read, to tell a blocking failure from a non-blocking one
(``blocked``, by the product's rule); ``unblocking_failures`` does that for the partitions
whose latest evaluation failed (``check --summary``, the plan).

Held evaluations (``HeldChecks``): Dagster 1.13 stores each check evaluation on its own (they
are not batchable), and a check step over a run of 500 partitions yields 500 of them in a row,
then its outputs. Both event logs hold a step's evaluations here and write them with the next
event, or at ``HELD_MAX``, in one go. An evaluation shows in the UI when its step yields the
next event, at the latest when the step ends; one reported outside a step (the UI, a sensor)
is written at once, since no next event of its step is coming. A process killed before that
next event loses them with the step, whose rerun evaluates again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import sqlalchemy as sa

from backfill_assets.accelerators.dagster_private import (
    AssetCheckExecutionRecordStatus,
    AssetCheckExecutionsTable,
    SqlEventLogStorage,
    serialize_value,
)

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
# ``evaluated_params``' keys, in the order of a VALUES list of them (``pg_event_log.py``).
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


def blocked(body: str | None, blocks: Callable[[dg.AssetCheckEvaluation], bool]) -> bool:
    """Whether a failed evaluation, stored as ``body``, blocked ``applied_labels`` by the
    product's rule ``blocks`` (``defs/instance_api.py``). A body that does not parse counts as
    blocked."""
    try:
        entry = dg.deserialize_value(body or "", dg.EventLogEntry)
        evaluation = entry.get_dagster_event().event_specific_data
    except Exception:
        return True
    if not isinstance(evaluation, dg.AssetCheckEvaluation):
        return True
    return blocks(evaluation)


def unblocked_in_run(
    storage: SqlEventLogStorage,
    asset_key: dg.AssetKey,
    check_names: Sequence[str],
    run_id: str,
    blocks: Callable[[dg.AssetCheckEvaluation], bool],
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
            if body is None or not blocked(body, blocks):
                out.setdefault(partition, set()).add(check_name)
    return out


def unblocking_failures(
    storage: SqlEventLogStorage,
    check_key: dg.AssetCheckKey,
    latest: Sequence[tuple[str, str]],
    blocks: Callable[[dg.AssetCheckEvaluation], bool],
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
            rows = conn.execute(query)
            out |= {partition for partition, body in rows if not blocked(body, blocks)}
    return out


# Evaluations held at most: a check step's whole run of 500 partitions (one evaluation each)
# twice over.
HELD_MAX = 1000


class HeldChecks:
    """The evaluations an event log holds back, and the lock its writes take (reentrant:
    Dagster's default ``store_event_batch`` calls ``store_event``)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._events: list[dg.EventLogEntry] = []

    def hold(self, event: dg.EventLogEntry) -> bool:
        """Hold ``event`` if it is a step's check evaluation (call with ``lock`` held)."""
        dagster_event = event.dagster_event
        if (
            dagster_event is None
            or dagster_event.event_type != dg.DagsterEventType.ASSET_CHECK_EVALUATION
            or dagster_event.step_key is None
        ):
            return False
        self._events.append(event)
        return True

    @property
    def full(self) -> bool:
        """``HELD_MAX`` are held: time to write them."""
        return len(self._events) >= HELD_MAX

    def take(self) -> list[dg.EventLogEntry]:
        """The held evaluations, in the order they came; none held afterwards."""
        events, self._events = self._events, []
        return events
