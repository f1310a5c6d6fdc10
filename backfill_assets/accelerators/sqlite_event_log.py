"""The embedded instance's event log: Dagster's SQLite storage, keeping its connections.

Dagster 1.13's ``SqliteEventLogStorage`` creates an engine for every statement (a ``NullPool``
engine per ``_connect``): each event paid for a fresh engine, a recompiled statement and a WAL
checkpoint, about half of a small run's Dagster time here. ``PooledSqliteEventLogStorage``
keeps one engine, with one pooled connection, per recently used shard; ``dagster.yaml`` opts
in through ``sqlite_instance.EmbeddedInstance``. The schema questions Dagster asks before each
asset event are answered once (``schema_facts.py``); new run shards are copies of an empty one
(``sqlite_shards.py``); a step's check evaluations are held
(``check_executions.HeldChecks``) and written
with its next event. A batch of events is written in one transaction a shard, serialised
before it locks a shard, the rows of a stretch of materialisations and evaluations a
statement a table (``_store_rows``); a batch is all or nothing, as on PostgreSQL. Every other
event is committed on its own in WAL mode with ``synchronous=NORMAL``: a commit survives a
SIGKILL. A write to a run shard touches its ``.db`` file's mtime, which Dagster's watchers
(the UI's live run view) watch. docs/architecture.md ("The embedded instance's event log")
has the whole account and its figures.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import dagster as dg
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from backfill_assets.accelerators.check_executions import (
    EVALUATED,
    PLANNED,
    HeldChecks,
    batchable,
    evaluated_params,
    planned_rows,
)
from backfill_assets.accelerators.dagster_private import (
    INDEX_SHARD_NAME,
    SQLITE_BUSY_TIMEOUT_SECONDS,
    ConfigurableClassData,
    DagsterSqliteStorage,
    SqlEventLogStorageTable,
    SqliteEventLogStorage,
    event_logs_directory,
)
from backfill_assets.accelerators.event_json import event_json, event_row
from backfill_assets.accelerators.schema_facts import EventLogSchemaFacts
from backfill_assets.accelerators.sqlite_shards import (
    normal_sync,
    place_new_shard,
    sweep_leftovers,
)

# Shards whose engine stays open: the index, the runs being written, the runs the UI shows.
_OPEN_SHARDS = 16
_LIVE: weakref.WeakSet[PooledSqliteEventLogStorage] = weakref.WeakSet()


class PooledSqliteEventLogStorage(EventLogSchemaFacts, SqliteEventLogStorage):
    """``SqliteEventLogStorage`` keeping an engine and a connection per recently used shard
    (and its schema questions answered once: ``schema_facts.py``)."""

    def __init__(
        self,
        base_dir: str,
        inst_data: ConfigurableClassData | None = None,
        open_shards: int = _OPEN_SHARDS,
    ) -> None:
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._open_shards = max(1, open_shards)
        # Events of the batch being written whose asset-table row a later one overwrites.
        self._superseded: set[int] = set()
        # While a batch is written: its thread and its open connection per shard.
        self._batch: dict[str, Connection] | None = None
        self._batch_thread: int | None = None
        self._swept = False  # other processes' leftovers, looked for at the first new shard
        # A step's check evaluations, written with its next event; its lock is taken before
        # ``_db_lock``, never after.
        self._held = HeldChecks()
        # The rows of the batch being written, serialised before it took any lock (an
        # evaluation's update of its planned row reuses its body: Dagster serialises again).
        self._rows: dict[int, tuple[dg.EventLogEntry, dict[str, Any]]] = {}
        super().__init__(base_dir, inst_data)
        _LIVE.add(self)

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: Mapping[str, Any]
    ) -> PooledSqliteEventLogStorage:
        """From the instance's storage defaults (``base_dir``: the shards' directory); Dagster's
        own names its class, not ``cls``."""
        return cls(str(config_value["base_dir"]), inst_data=inst_data)

    @property
    def open_engines(self) -> int:
        """Shards with an engine open in this process (at most ``open_shards``)."""
        return len(self._engines)

    def _engine(self, shard: str) -> Engine:
        engine = self._engines.get(shard)
        if engine is not None:
            self._engines.move_to_end(shard)
            return engine
        engine = sa.create_engine(
            self.conn_string_for_shard(shard),
            pool_size=1,
            max_overflow=4,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS},
        )
        sa.event.listen(engine, "connect", normal_sync)
        if shard not in self._initialized_dbs:
            if shard == INDEX_SHARD_NAME or not self._place_new_shard(shard):
                self._initdb(engine)  # creates what is missing, or checks the revision
            self._initialized_dbs.add(shard)
        self._engines[shard] = engine
        while len(self._engines) > self._open_shards:
            _old, evicted = self._engines.popitem(last=False)
            evicted.dispose()
        return engine

    def _place_new_shard(self, shard: str) -> bool:
        """A new run's shard copied from an empty one (``sqlite_shards.py``); False when it
        exists. The first new shard a storage places sweeps what killed processes left."""
        path = self.path_for_shard(shard)
        if os.path.exists(path):
            return False
        if not self._swept:
            self._swept = True
            sweep_leftovers(self._base_dir)
        return place_new_shard(path, self._base_dir, self._initdb)

    def store_event(self, event: dg.EventLogEntry) -> None:
        """A step's check evaluation is held (``check_executions.HeldChecks``) and written with
        the next event in one transaction a shard; every other event as Dagster stores it,
        after the evaluations held."""
        with self._held.lock:
            if self._held.hold(event):
                if self._held.full:
                    self._write_held([])
                return
            self._write_held([event])

    def store_event_batch(self, events: Sequence[dg.EventLogEntry]) -> None:
        """Store the events in one transaction per shard, committed run shards first (as one
        event at a time, the index never names an event its run shard lacks). On an error
        nothing of the batch is stored, and Dagster stores the events one by one.

        An asset's row in the asset table holds what its latest event of each kind set (the
        last materialisation, the last run): of a batch's events of one asset and kind only the
        last one writes it, the row ending as it would one event at a time (Dagster's
        PostgreSQL storage writes only a batch's last event there too)."""
        with self._held.lock:
            self._write_held([])  # apart: Dagster's fallback would store the batch again
            if len(events) < 2:
                super().store_event_batch(events)
            else:
                self._in_one_transaction(events)

    def flush(self) -> None:
        """Write the check evaluations held back (at dispose and exit too)."""
        with self._held.lock:
            self._write_held([])

    def _write_held(self, then: list[dg.EventLogEntry]) -> None:
        events = [*self._held.take(), *then]
        if len(events) < 2:
            for event in events:
                super().store_event(event)
            return
        try:
            self._in_one_transaction(events)
        except Exception:
            # All or nothing failed: one at a time, as Dagster does after a failed batch.
            for event in events:
                super().store_event(event)

    def _in_one_transaction(self, events: Sequence[dg.EventLogEntry]) -> None:
        last: dict[tuple[str, str], int] = {}
        for event in events:
            dagster_event = event.dagster_event
            if dagster_event is not None and dagster_event.asset_key is not None:
                last[(dagster_event.asset_key.to_string(), dagster_event.event_type_value)] = id(
                    event
                )
        # Serialised before any shard is locked: the index's write lock, which the other run
        # processes wait for, is held for the inserts only.
        self._rows = {id(e): (e, event_row(e)) for e in events}
        with self._db_lock:
            held: dict[str, Connection] = {}
            self._batch, self._batch_thread = held, threading.get_ident()
            kept = set(last.values())
            self._superseded = {
                id(e) for e in events if e.dagster_event is not None and id(e) not in kept
            }
            try:
                # In order: a run shard's ids follow its events; the rows of a stretch of
                # materialisations and evaluations go in with one statement a shard.
                for insertable, stretch in itertools.groupby(events, key=_insertable):
                    if insertable:
                        self._store_rows(list(stretch))
                    else:
                        for event in stretch:
                            super().store_event(event)
                for shard in sorted(held, key=lambda name: name == INDEX_SHARD_NAME):
                    held[shard].commit()
                    if shard != INDEX_SHARD_NAME:
                        with contextlib.suppress(OSError):  # the watchers: see ``_connect``
                            os.utime(self.path_for_shard(shard))
            finally:
                self._batch, self._batch_thread = None, None
                self._superseded, self._rows = set(), {}
                for conn in held.values():
                    conn.close()  # rolls back what was not committed

    def _store_rows(self, events: list[dg.EventLogEntry]) -> None:
        """What Dagster's ``store_event`` writes for each of ``events`` (``_insertable``, their
        rows serialised), inside the batch's transaction, a statement a table: the run shards'
        rows, the index's with their ids returned in order, the materialisations' indexed tags
        and asset rows, the evaluations' updates of their planned rows. Dagster compiles a
        statement for each row of each (~0.4 ms an event here)."""
        rows = [self._rows[id(event)][1] for event in events]
        runs: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            runs.setdefault(row["run_id"], []).append(row)
        for run_id, run_rows in runs.items():
            with self.run_connection(run_id) as conn:
                conn.execute(_INSERT_EVENT, run_rows)
        with self.index_connection() as conn:
            ids = conn.execute(_INSERT_EVENT_IDS, rows).scalars().all()
            materialised = [(e, i) for e, i in zip(events, ids, strict=True) if not _is_check(e)]
            if materialised:
                self._store_asset_event_tags(
                    conn, [e for e, _ in materialised], [i for _, i in materialised]
                )
                for event, event_id in materialised:
                    self._store_asset_event(conn, event, event_id)
            checks = [
                (event, row["event"], event_id)
                for event, row, event_id in zip(events, rows, ids, strict=True)
                if _is_check(event)
            ]
            if not checks:
                return
            updated = conn.execute(EVALUATED, [evaluated_params(*c) for c in checks]).rowcount
        if updated != len(checks):
            # A planned row missing (or, against the unique index, doubled): Dagster's own
            # update, one at a time, inserts the row or raises; the rows updated already are
            # updated again to the same values.
            for event, _body, event_id in checks:
                super()._update_asset_check_evaluation(event, event_id)

    def _store_asset_event(self, conn: Connection, event: dg.EventLogEntry, event_id: int) -> None:
        if id(event) in self._superseded:
            return  # a later event of the batch writes the same columns of the same row
        super()._store_asset_event(conn, event, event_id)

    def _store_asset_check_evaluation_planned(
        self, event: dg.EventLogEntry, event_id: int | None
    ) -> None:
        """Dagster's rows, the event serialised once (``check_executions.py``)."""
        with self.index_connection() as conn:
            conn.execute(PLANNED, planned_rows(event, event_id))

    def _event_to_row(self, event: dg.EventLogEntry) -> dict[str, Any]:
        return self._ready_row(event) or event_row(event)

    def _ready_row(self, event: dg.EventLogEntry) -> dict[str, Any] | None:
        """``event``'s row if the batch being written serialised it already."""
        ready = self._rows.get(id(event))
        return ready[1] if ready is not None and ready[0] is event else None

    def _update_asset_check_evaluation(self, event: dg.EventLogEntry, event_id: int | None) -> None:
        """Dagster's, with the statement built once and the body the event row was written
        with. Anything but one row updated (no planned row, or several) goes to Dagster's own,
        which inserts the row or raises."""
        if not batchable(event):
            super()._update_asset_check_evaluation(event, event_id)
            return
        row = self._ready_row(event)  # held evaluations are written in batches
        params = evaluated_params(event, row["event"] if row else event_json(event), event_id)
        with self.index_connection() as conn:
            updated = conn.execute(EVALUATED, params).rowcount
        if updated != 1:
            super()._update_asset_check_evaluation(event, event_id)

    @contextlib.contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        held = self._batch
        if held is not None and self._batch_thread == threading.get_ident():
            # Inside ``store_event_batch`` (which holds the lock): the batch's transaction.
            conn = held.get(shard)
            if conn is None:
                conn = held[shard] = self._engine(shard).connect()
                conn.begin()
            yield conn
            return
        with self._db_lock, self._engine(shard).connect() as conn:
            raw = conn.connection.driver_connection
            changes = raw.total_changes if raw is not None else 0
            with conn.begin():
                yield conn
            if raw is not None and shard != INDEX_SHARD_NAME and raw.total_changes != changes:
                # Watchers of this run see its events as modifications of its .db file, which
                # in WAL mode changes only at a checkpoint (an fsync of the file): a new mtime
                # tells them (inotify, FSEvents and polling alike); they read the WAL anyway.
                with contextlib.suppress(OSError):
                    os.utime(self.path_for_shard(shard))

    def _close_all(self) -> None:
        with self._db_lock:
            engines, self._engines = list(self._engines.values()), OrderedDict()
        for engine in engines:
            engine.dispose()

    def _forget_all(self) -> None:
        # In a forked child: the parent's connections are not ours to use or close.
        for engine in self._engines.values():
            engine.dispose(close=False)
        self._engines = OrderedDict()
        self._db_lock = threading.Lock()

    def wipe(self) -> None:
        """Dagster's wipe deletes the run shards' files: close them first."""
        self._close_all()
        super().wipe()

    def dispose(self) -> None:
        """Close every shard's connection, then Dagster's own clean-up."""
        self.flush()
        self._close_all()
        super().dispose()


_INSERT_EVENT = SqlEventLogStorageTable.insert()
_INSERT_EVENT_IDS = SqlEventLogStorageTable.insert().returning(
    SqlEventLogStorageTable.c.id, sort_by_parameter_order=True
)
_MATERIALIZATION = dg.DagsterEventType.ASSET_MATERIALIZATION.value
_CHECK_EVALUATION = dg.DagsterEventType.ASSET_CHECK_EVALUATION.value


def _is_check(event: dg.EventLogEntry) -> bool:
    return event.get_dagster_event().event_type_value == _CHECK_EVALUATION


def _insertable(event: dg.EventLogEntry) -> bool:
    """A materialisation, or an evaluation ``EVALUATED`` writes: ``_store_rows`` writes them
    (every other event goes Dagster's way)."""
    dagster_event = event.dagster_event
    if dagster_event is None or not event.run_id:
        return False
    kind = dagster_event.event_type_value
    return kind == _MATERIALIZATION or (kind == _CHECK_EVALUATION and batchable(event))


class PooledSqliteStorage(DagsterSqliteStorage):
    """Dagster's SQLite storage (runs, schedules) with ``PooledSqliteEventLogStorage``."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None) -> None:
        super().__init__(base_dir, inst_data)
        # Dagster's constructor made the stock event log (nothing opened yet): replace it.
        self._event_log_storage = PooledSqliteEventLogStorage(event_logs_directory(base_dir))

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: Mapping[str, Any]
    ) -> PooledSqliteStorage:
        """From the instance's storage defaults (``base_dir``: the instance's home); Dagster's
        own names its class, not ``cls``."""
        return cls.from_local(str(config_value["base_dir"]), inst_data=inst_data)


def close_event_logs() -> None:
    """Close every pooled shard connection of this process (each last close checkpoints its
    WAL into the .db file, as Dagster's own storage leaves it): at exit, and in a run helper
    before it leaves."""
    for storage in list(_LIVE):
        storage.flush()
        storage._close_all()


def _after_fork_in_child() -> None:
    for storage in list(_LIVE):
        storage._forget_all()


os.register_at_fork(after_in_child=_after_fork_in_child)
# At exit (the CLI runs its exit hooks before it leaves with os._exit: cli/process.py).
atexit.register(close_event_logs)
