"""The production instance's event log: Dagster's PostgreSQL one, check evaluations batched.

Dagster's PostgreSQL event log opens a new connection for every statement (``NullPool``, so an
idle run worker holds none) and stores each check evaluation on its own: its event row on one
connection, the update of its partition's planned row on a second, each committed alone. A
check step over 500 partitions yields 500 evaluations, so 1,000 connections a run, and
Dagster serialises each evaluation twice. ``BatchingPostgresEventLogStorage`` holds a step's
evaluations (``check_executions.HeldChecks``) and writes them with the step's next event:
their event rows
in one multi-row ``INSERT ... RETURNING`` (as Dagster's own materialisation batch), the
planned rows' updates in one statement, each body serialised once and both statements built
by the driver. The rows are those Dagster writes; an evaluation with no planned row, or none of
a partition, goes Dagster's own way. A step's materialisations are written as Dagster's batch
writes them, their rows inserted by the driver too. Its sessions compress long values with
lz4 where the server offers it (``compress_with_lz4``). ``deploy/dagster.postgres.yaml`` names
``pg_instance.BatchingPostgresStorage`` under ``storage: custom:``, which builds
``AcceleratedPostgresStorage`` here on the Dagster release it was written for; everything else
is Dagster's ``DagsterPostgresStorage``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg
import sqlalchemy as sa
from psycopg2.extras import execute_values
from sqlalchemy.engine import Connection, Engine

from backfill_assets.accelerators.check_executions import (
    EVALUATED_PARAMS,
    HeldChecks,
    batchable,
    evaluated_params,
    planned_columns,
)
from backfill_assets.accelerators.dagster_private import (
    ConfigurableClassData,
    DagsterPostgresStorage,
    PostgresEventLogStorage,
    PostgresRunStorage,
    get_token_provider_from_config,
    pg_url_from_config,
)
from backfill_assets.accelerators.event_json import event_row
from backfill_assets.accelerators.schema_facts import EventLogSchemaFacts, RunSchemaFacts


class BatchingPostgresEventLogStorage(EventLogSchemaFacts, PostgresEventLogStorage):
    """``PostgresEventLogStorage`` writing a step's check evaluations together (and its schema
    questions answered once: ``schema_facts.py``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._held = HeldChecks()
        super().__init__(*args, **kwargs)
        self._lz4 = compress_with_lz4(self._engine)

    def optimize_for_webserver(
        self, statement_timeout: int, pool_recycle: int, max_overflow: int
    ) -> None:
        """Dagster's (a pooled engine in place of its own; the CLI and the webserver use it),
        its sessions compressing with lz4 as the first engine's did."""
        super().optimize_for_webserver(statement_timeout, pool_recycle, max_overflow)
        if self._lz4:
            sa.event.listen(self._engine, "do_connect", _with_lz4)

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
        """Dagster's, after the evaluations held; a batch of materialisations as Dagster
        writes it, its rows inserted by the driver (``_insert_rows``)."""
        with self._held.lock:
            self._write_held()
            kinds = {event.get_dagster_event().event_type for event in events}
            if kinds == {dg.DagsterEventType.ASSET_MATERIALIZATION}:
                self._store_materializations(events)
            else:
                super().store_event_batch(events)

    def _store_materializations(self, events: Sequence[dg.EventLogEntry]) -> None:
        """Dagster's ``store_event_batch`` of materialisations: the rows in one statement, the
        indexed tags, and the asset's row by the batch's last event. Dagster compiles the
        multi-row INSERT anew each time (3,500 parameters for a step of 500 partitions). One
        statement, so on an error nothing is stored and Dagster stores the events one by one."""
        ids = self._insert_rows([self._event_to_row(e) for e in events])
        if len(ids) != len(events):
            raise RuntimeError(f"{len(events)} event rows inserted, {len(ids)} ids returned")
        with self.index_transaction() as conn:
            self._store_asset_event_tags(conn, events, ids)
            self._store_asset_event(conn, events[-1], ids[-1])

    def flush(self) -> None:
        """Write the check evaluations held back (at dispose and exit too)."""
        with self._held.lock:
            self._write_held()

    def dispose(self) -> None:
        """Write what is held, then Dagster's own clean-up."""
        self.flush()
        super().dispose()

    def _event_to_row(self, event: dg.EventLogEntry) -> dict[str, Any]:
        """Dagster's row of ``event``, serialised by ``event_json``."""
        return event_row(event)

    def _store_asset_check_evaluation_planned(
        self, event: dg.EventLogEntry, event_id: int | None
    ) -> None:
        """Dagster's rows, the event serialised once (``check_executions.py``) and sent once:
        one row a partition made by the server from an array of the keys. As an executemany
        the 7 KB body of a run of 500 partitions was quoted into the statement 500 times (3.5
        MB to build, send and parse a run)."""
        shared, partition_keys = planned_columns(event, event_id)
        with self.index_connection() as conn:
            conn.execute(_PLANNED_ALL, {**shared, "partitions": partition_keys})

    def _write_held(self) -> None:
        events = self._held.take()
        if not events:
            return
        rows = [self._event_to_row(e) for e in events]
        try:
            ids = self._insert_rows(rows)
        except Exception:
            # One statement, so nothing was stored: one at a time, as Dagster does after a
            # failed batch. (A failure after it raises: the rows are in.)
            for event in events:
                super().store_event(event)
            return
        if len(ids) != len(events):
            raise RuntimeError(f"{len(events)} event rows inserted, {len(ids)} ids returned")
        updates: list[dict[str, Any]] = []
        batched: list[tuple[dg.EventLogEntry, int]] = []
        for event, row, event_id in zip(events, rows, ids, strict=True):
            if not batchable(event):
                self.store_asset_check_event(event, event_id)  # Dagster's way
                continue
            batched.append((event, event_id))
            updates.append(evaluated_params(event, row["event"], event_id))
        if not updates:
            return
        with self.index_transaction() as conn:
            updated = _update_evaluated(conn, updates)
        if updated != len(updates):
            # Some partition had no planned row (or several): Dagster's own update inserts the
            # row or raises; rerunning it for those updated already writes the same values.
            for event, event_id in batched:
                self._update_asset_check_evaluation(event, event_id)

    def _insert_rows(self, rows: list[dict[str, Any]]) -> list[int]:
        """The event rows in one statement (as Dagster's own batch), their ids in order."""
        with self._connect() as conn:
            cursor = _cursor(conn)
            try:
                found = execute_values(
                    cursor,
                    f"INSERT INTO event_logs ({', '.join(_EVENT_COLUMNS)}) VALUES %s RETURNING id",
                    [tuple(row[c] for c in _EVENT_COLUMNS) for row in rows],
                    page_size=len(rows),
                    fetch=True,
                )
            finally:
                cursor.close()
            return [int(row[0]) for row in found]


# Statements built by the driver (``execute_values``): SQLAlchemy compiled a multi-row statement
# of 7,000 to 9,000 parameters anew for every step, ~8% of a run of 10,000 small tenants.
_EVENT_COLUMNS = (
    "run_id",
    "event",
    "dagster_event_type",
    "timestamp",
    "step_key",
    "asset_key",
    "partition",
)
# ``check_executions.PLANNED`` for a run's partitions: the shared columns once, a row a key.
_PLANNED_ALL = sa.text(
    "INSERT INTO asset_check_executions (asset_key, check_name, partition, run_id,"
    " execution_status, evaluation_event, evaluation_event_timestamp,"
    " evaluation_event_storage_id)"
    " SELECT :asset_key, :check_name, u.partition, :run_id, :execution_status,"
    " :evaluation_event, :evaluation_event_timestamp, :evaluation_event_storage_id"
    " FROM unnest(CAST(:partitions AS TEXT[])) WITH ORDINALITY AS u(partition, n) ORDER BY u.n"
)
# ``check_executions.EVALUATED`` for many evaluations: the UPDATE joined to a VALUES list (one
# statement; psycopg2 runs an executemany as a round trip a row), its columns in
# ``EVALUATED_PARAMS`` order. A column of NULLs in a VALUES list is text, hence the casts.
_EVALUATED_ALL = (
    "UPDATE asset_check_executions AS t SET execution_status = v.status,"
    " evaluation_event = v.body, evaluation_event_timestamp = CAST(v.ts AS TIMESTAMP),"
    " evaluation_event_storage_id = CAST(v.event_id AS BIGINT),"
    " materialization_event_storage_id = CAST(v.target_id AS BIGINT)"
    " FROM (VALUES %s) AS v(asset_key, check_name, run_id, partition, status, body, ts,"
    " event_id, target_id)"
    " WHERE t.asset_key = v.asset_key AND t.check_name = v.check_name"
    " AND t.run_id = v.run_id AND t.partition = v.partition"
)


def compress_with_lz4(engine: Engine) -> bool:
    """Have ``engine``'s sessions compress long values with lz4 rather than pglz, when the
    server offers lz4 (PostgreSQL 14+, built with it) and its operator left the setting at
    its default; whether they will.

    Every event body (~4 KB) and check row Dagster writes is compressed on the server: pglz was
    ~11% of the database's CPU in a run of 10,000 one-partition tenants, lz4 takes a fraction
    of that. Readers need nothing: each value records its method. The setting travels in the
    connection's startup packet (``options``), so it costs no statement. A server that cannot
    be asked now (down, restarting) is left to Dagster's own retries, at its own default."""
    try:
        with engine.connect() as conn:
            row = conn.execute(_TOAST_SETTING).first()
    except sa.exc.DBAPIError:
        return False
    if row is None or row.source != "default" or "lz4" not in (row.enumvals or []):
        return False
    sa.event.listen(engine, "do_connect", _with_lz4)
    return True


_TOAST_SETTING = sa.text(
    "SELECT source, enumvals FROM pg_settings WHERE name = 'default_toast_compression'"
)


def _with_lz4(_dialect: Any, _record: Any, _args: Any, params: dict[str, Any]) -> None:
    params["options"] = f"{params.get('options', '')} -c default_toast_compression=lz4".strip()


def _cursor(conn: Connection) -> Any:
    raw = conn.connection.driver_connection
    if raw is None:
        raise RuntimeError("connection is closed")
    return raw.cursor()


def _update_evaluated(conn: Connection, updates: list[dict[str, Any]]) -> int:
    """``EVALUATED`` for each of ``updates`` in one statement; the rows updated."""
    cursor = _cursor(conn)
    try:
        execute_values(
            cursor,
            _EVALUATED_ALL,
            [tuple(u[k] for k in EVALUATED_PARAMS) for u in updates],
            page_size=len(updates),  # one page: the rowcount is the statement's
        )
        return int(cursor.rowcount)
    finally:
        cursor.close()


class KnownSchemaPostgresRunStorage(RunSchemaFacts, PostgresRunStorage):
    """``PostgresRunStorage``, its schema questions answered once (``schema_facts.py``)."""


class AcceleratedPostgresStorage(DagsterPostgresStorage):
    """``DagsterPostgresStorage`` (schedules) with ``BatchingPostgresEventLogStorage`` and
    ``KnownSchemaPostgresRunStorage`` (``pg_instance.BatchingPostgresStorage`` builds it)."""

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
        # Likewise the run storage; the stock one has made its tables if it was to.
        self._run_storage = KnownSchemaPostgresRunStorage(
            postgres_url, should_autocreate_tables=False, token_provider=token_provider
        )

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: Mapping[str, Any]
    ) -> AcceleratedPostgresStorage:
        """As Dagster's (which names its own class, not ``cls``)."""
        return cls(
            pg_url_from_config(config_value),
            config_value.get("should_autocreate_tables", True),
            inst_data,
            get_token_provider_from_config(config_value),
        )
