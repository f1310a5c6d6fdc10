"""Dagster event-log entries built by hand, and what an event log stored of them: shared by
the embedded (SQLite) and production (PostgreSQL) instance tests."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import dagster as dg
from dagster._core.events import AssetCheckEvaluationPlanned, DagsterEvent, DagsterEventType
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage
from dagster._serdes import deserialize_value, serialize_value


def entry(run_id: str, message: str) -> EventLogEntry:
    return EventLogEntry(
        error_info=None,
        level="INFO",
        user_message=message,
        run_id=run_id,
        timestamp=time.time(),
    )


def dagster_entry(
    run_id: str, kind: DagsterEventType, data: Any, step_key: str | None = None
) -> EventLogEntry:
    event = DagsterEvent(
        event_type_value=kind.value, job_name="job", event_specific_data=data, step_key=step_key
    )
    return EventLogEntry(
        error_info=None,
        level="INFO",
        user_message="",
        run_id=run_id,
        timestamp=time.time(),
        dagster_event=event,
    )


LABELS = dg.AssetKey("labels")
# An asset's row in ``asset_keys`` as an event log writes it (not its id, nor the database's
# clock at its creation).
ASSET_ROW = (
    "asset_key, last_materialization, last_run_id, asset_details, wipe_timestamp,"
    " last_materialization_timestamp, tags, cached_status_data"
)


def check_event(run_id: str, data: Any, step_key: str | None = "checks") -> EventLogEntry:
    kind = (
        DagsterEventType.ASSET_CHECK_EVALUATION
        if isinstance(data, dg.AssetCheckEvaluation)
        else DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED
    )
    return dagster_entry(run_id, kind, data, step_key)


def as_dagster(value: Any) -> Any:
    """A stored value as Dagster would have written it: an event body (ours is compact orjson,
    Dagster's spaced ``json.dumps``) as Dagster serialises what it reads of it; anything else
    as it is. Comparing tables through it compares what Dagster reads."""
    if isinstance(value, str) and value.startswith('{"') and '"__class__"' in value:
        return serialize_value(deserialize_value(value))
    return value


def dagster_rows(rows: Any) -> list[tuple[Any, ...]]:
    """``rows`` with every value ``as_dagster``."""
    return [tuple(as_dagster(v) for v in row) for row in rows]


def check_rows(storage: SqlEventLogStorage) -> list[tuple[Any, ...]]:
    with storage.index_connection() as conn:
        rows = conn.exec_driver_sql(
            "SELECT asset_key, check_name, partition, run_id, execution_status, evaluation_event,"
            " evaluation_event_timestamp, evaluation_event_storage_id,"
            " materialization_event_storage_id FROM asset_check_executions ORDER BY partition"
        )
        return dagster_rows(rows)


def check_run(n: int) -> tuple[str, EventLogEntry, list[EventLogEntry]]:
    """A run's planned check event over ``n`` partitions and an evaluation of each."""
    keys = [f"s00|t{i:03d}" for i in range(n)]
    subset = dg.StaticPartitionsDefinition(keys).subset_with_partition_keys(keys)
    run_id = str(uuid.uuid4())
    planned = check_event(
        run_id,
        AssetCheckEvaluationPlanned(
            asset_key=LABELS, check_name="integrity", partitions_subset=subset
        ),
    )
    evaluations = [
        check_event(
            run_id,
            dg.AssetCheckEvaluation(
                asset_key=LABELS,
                check_name="integrity",
                passed=i % 3 != 0,
                metadata={"n": i},
                partition=pk,
            ),
        )
        for i, pk in enumerate(keys)
    ]
    return run_id, planned, evaluations


def run_log(storage: SqlEventLogStorage, run_id: str) -> list[str]:
    return [e.dagster_event_type or e.user_message for e in storage.get_logs_for_run(run_id)]


@dataclass(frozen=True)
class StoredCheckRun:
    """What a check step's events left: the planned rows, and how many commits or connections
    (whatever ``counted`` collects) its evaluations took before the next event and with it."""

    planned_rows: list[tuple[Any, ...]]
    held: int
    spent: int


def store_check_run(
    storage: SqlEventLogStorage,
    run_id: str,
    planned: EventLogEntry,
    evaluations: list[EventLogEntry],
    counted: list[str],
) -> StoredCheckRun:
    """Store a run's start, its planned check event, the evaluations and the step's next event,
    one at a time as Dagster sends them."""
    storage.store_event(entry(run_id, "start"))
    storage.store_event(planned)
    planned_rows = check_rows(storage)
    counted.clear()
    for event in evaluations:
        storage.store_event(event)
    held = len(counted)
    storage.store_event(entry(run_id, "the step's next event"))
    return StoredCheckRun(planned_rows, held, len(counted))


@dataclass(frozen=True)
class BesideStock:
    """The same check run stored by Dagster's storage and ours: the check rows (equal in both)
    and each storage's ``held`` and ``spent`` counts, keyed ``stock`` and ``ours``."""

    rows: list[tuple[Any, ...]]
    held: dict[str, int]
    spent: dict[str, int]


def store_beside_stock(
    stock: SqlEventLogStorage,
    ours: SqlEventLogStorage,
    run: tuple[str, EventLogEntry, list[EventLogEntry]],
    counted: list[str],
) -> BesideStock:
    """``store_check_run`` of ``run`` (``check_run``'s) on both storages; asserts ours wrote
    Dagster's planned rows, check rows and run log."""
    run_id, planned, evaluations = run
    runs = {
        name: store_check_run(storage, run_id, planned, evaluations, counted)
        for name, storage in (("stock", stock), ("ours", ours))
    }
    # The planned rows (one a partition, the event serialised once) as Dagster's own.
    assert runs["ours"].planned_rows == runs["stock"].planned_rows
    rows = check_rows(ours)
    # Storage ids differ between the databases only if the order did.
    assert rows == check_rows(stock)
    # The run's log holds the same events in the same order: the evaluations before the event
    # that wrote them.
    assert run_log(ours, run_id) == run_log(stock, run_id)
    return BesideStock(
        rows,
        {name: r.held for name, r in runs.items()},
        {name: r.spent for name, r in runs.items()},
    )
