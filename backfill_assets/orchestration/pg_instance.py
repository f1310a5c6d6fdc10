"""The production instance's storage: Dagster's PostgreSQL storage, check evaluations batched.

Dagster's PostgreSQL event log opens a new connection for every statement (``NullPool``, so an
idle run worker holds none) and stores each check evaluation on its own: its event row on one
connection, the update of its partition's planned row on a second, each committed alone. A
check step over 500 partitions yields 1,000 evaluations, so 2,000 connections a run, and
Dagster serialises each evaluation twice. ``BatchingPostgresEventLogStorage`` holds a step's
evaluations (``held_checks.py``) and writes them with the step's next event: their event rows
in one multi-row ``INSERT ... RETURNING`` (as Dagster's own materialisation batch), the
planned rows' updates in one transaction, each body serialised once. The rows are those
Dagster writes; an evaluation with no planned row, or none of a partition, goes Dagster's own
way. ``deploy/dagster.postgres.yaml`` names ``BatchingPostgresStorage`` under
``storage: custom:``; everything else is Dagster's ``DagsterPostgresStorage``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg
import sqlalchemy as sa

from backfill_assets.orchestration.dagster_private import (
    AssetCheckExecutionRecordStatus,
    AssetCheckExecutionsTable,
    ConfigurableClassData,
    DagsterPostgresStorage,
    PostgresEventLogStorage,
    SqlEventLogStorageTable,
    get_token_provider_from_config,
    pg_url_from_config,
)
from backfill_assets.orchestration.held_checks import HeldChecks

_T = AssetCheckExecutionsTable.c
# The update Dagster runs for each evaluation, built once and run for a batch (executemany).
_EVALUATED = (
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


class BatchingPostgresEventLogStorage(PostgresEventLogStorage):
    """``PostgresEventLogStorage`` writing a step's check evaluations together."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._held = HeldChecks()
        super().__init__(*args, **kwargs)

    def store_event(self, event: dg.EventLogEntry) -> None:
        """A step's check evaluation is held and written with the next event; every other
        event as Dagster stores it, after the evaluations held."""
        with self._held.lock:
            if self._held.hold(event):
                if self._held.full:
                    self._write_held()
                return
            self._write_held()
            super().store_event(event)

    def store_event_batch(self, events: Sequence[dg.EventLogEntry]) -> None:
        """Dagster's, after the evaluations held."""
        with self._held.lock:
            self._write_held()
            super().store_event_batch(events)

    def flush(self) -> None:
        """Write the check evaluations held back (at dispose and exit too)."""
        with self._held.lock:
            self._write_held()

    def dispose(self) -> None:
        """Write what is held, then Dagster's own clean-up."""
        self.flush()
        super().dispose()

    def _write_held(self) -> None:
        events = self._held.take()
        if not events:
            return
        try:
            self._write_evaluations(events)
        except Exception:
            # Nothing was stored (one statement for the event rows, fails whole): one at a
            # time, as Dagster does after a failed batch.
            for event in events:
                super().store_event(event)

    def _write_evaluations(self, events: list[dg.EventLogEntry]) -> None:
        rows = [self._event_to_row(e) for e in events]
        with self._connect() as conn:
            result = conn.execute(
                SqlEventLogStorageTable.insert()
                .values(rows)
                .returning(SqlEventLogStorageTable.c.id)
            )
            ids = [int(row[0]) for row in result.fetchall()]
        assert len(ids) == len(events)
        updates: list[dict[str, Any]] = []
        partitioned: list[tuple[dg.EventLogEntry, int]] = []
        for event, row, event_id in zip(events, rows, ids, strict=True):
            evaluation: Any = event.get_dagster_event().event_specific_data
            if evaluation.partition is None or not event.run_id:
                self.store_asset_check_event(event, event_id)  # Dagster's way
                continue
            target = evaluation.target_materialization_data
            partitioned.append((event, event_id))
            updates.append(
                {
                    "b_asset_key": evaluation.asset_key.to_string(),
                    "b_check_name": evaluation.check_name,
                    "b_run_id": event.run_id,
                    "b_partition": evaluation.partition,
                    "b_status": (
                        AssetCheckExecutionRecordStatus.SUCCEEDED.value
                        if evaluation.passed
                        else AssetCheckExecutionRecordStatus.FAILED.value
                    ),
                    "b_body": row["event"],
                    "b_timestamp": row["timestamp"],
                    "b_event_id": event_id,
                    "b_target_id": target.storage_id if target else None,
                }
            )
        if not updates:
            return
        with self.index_transaction() as conn:
            updated = conn.execute(_EVALUATED, updates).rowcount
        if updated != len(updates):
            # Some partition had no planned row (or several): Dagster's own update inserts the
            # row or raises; rerunning it for those updated already writes the same values.
            for event, event_id in partitioned:
                self._update_asset_check_evaluation(event, event_id)


class BatchingPostgresStorage(DagsterPostgresStorage):
    """``DagsterPostgresStorage`` (runs, schedules) with ``BatchingPostgresEventLogStorage``."""

    def __init__(
        self,
        postgres_url: str,
        should_autocreate_tables: bool = True,
        inst_data: ConfigurableClassData | None = None,
        token_provider: Any = None,
    ) -> None:
        super().__init__(postgres_url, should_autocreate_tables, inst_data, token_provider)
        # Dagster's constructor made the stock event log (it holds no connection): replace it.
        self._event_log_storage = BatchingPostgresEventLogStorage(
            postgres_url, should_autocreate_tables, token_provider=token_provider
        )

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: Mapping[str, Any]
    ) -> BatchingPostgresStorage:
        """As Dagster's (which names its own class, not ``cls``)."""
        return cls(
            pg_url_from_config(config_value),
            config_value.get("should_autocreate_tables", True),
            inst_data,
            get_token_provider_from_config(config_value),
        )
