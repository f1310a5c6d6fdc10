"""The embedded instance (``dagster.yaml``'s ``instance_class``): Dagster's SQLite storage with
an event log that keeps each shard's connection open. What Dagster's own readers, watchers and
clean-up see must not change."""

from __future__ import annotations

import contextlib
import os
import pickle
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from dagster._core.definitions.data_version import DATA_VERSION_TAG
from dagster._core.events import (
    DagsterEventType,
    StepMaterializationData,
)
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage

from backfill_assets.accelerators import check_executions, sqlite_event_log
from backfill_assets.accelerators.sqlite_event_log import PooledSqliteEventLogStorage
from backfill_assets.accelerators.sqlite_instance import EmbeddedInstance
from backfill_assets.runner.instance import INSTANCE_TEMPLATE
from backfill_tests.accelerators.event_entries import (
    ASSET_ROW,
    LABELS,
    check_event,
    check_rows,
    check_run,
    dagster_entry,
    dagster_rows,
    entry,
    run_log,
    store_beside_stock,
)


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_bytes(INSTANCE_TEMPLATE.read_bytes())
    return home


@dg.op
def _hello() -> int:
    return 1


@dg.job
def _hello_job() -> None:
    _hello()


def test_the_project_instance_is_the_embedded_one_under_its_own_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = _home(tmp_path)
    # Another home in the environment must not pull the event log over there.
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "elsewhere"))
    with dg.DagsterInstance.from_config(str(home)) as inst:
        assert isinstance(inst, EmbeddedInstance)
        storage = inst.event_log_storage
        assert isinstance(storage, PooledSqliteEventLogStorage)
        assert Path(storage._base_dir) == home / "history" / "runs"
        result = _hello_job.execute_in_process(instance=inst)
        assert result.success
        run_id = result.run_id
    assert not (tmp_path / "elsewhere").exists()
    # Dagster's stock storage, in a fresh object, reads every event of the run.
    stock = SqliteEventLogStorage(str(home / "history" / "runs"))
    records = stock.get_records_for_run(run_id).records
    types = [r.event_log_entry.dagster_event_type for r in records]
    assert dg.DagsterEventType.RUN_SUCCESS in types
    assert dg.DagsterEventType.STEP_SUCCESS in types
    assert run_id in stock.get_all_run_ids()


def test_a_watcher_elsewhere_sees_each_event_as_it_is_written(tmp_path: Path) -> None:
    # The UI's live view of a run watches the run's .db file (watchdog), which in WAL mode
    # changes only at a checkpoint: a kept-open connection must still let each event show.
    base = str(tmp_path / "runs")
    writer = PooledSqliteEventLogStorage(base)
    reader = SqliteEventLogStorage(base)
    run_id = str(uuid.uuid4())
    writer.store_event(entry(run_id, "first"))  # the shard exists before the watch starts
    seen: list[str] = []
    arrived = threading.Event()

    def on_event(entry: EventLogEntry, _cursor: str) -> None:
        seen.append(entry.user_message)
        arrived.set()

    reader.watch(run_id, None, on_event)
    try:
        for message in ("second", "third"):
            arrived.clear()
            writer.store_event(entry(run_id, message))
            assert arrived.wait(10), f"the watcher never saw {message!r}: {seen}"
        assert seen[-1] == "third"
    finally:
        reader.end_watch(run_id, on_event)
        reader.dispose()
        writer.dispose()


def test_engines_stay_bounded_and_wipe_closes_them_first(tmp_path: Path) -> None:
    base = tmp_path / "runs"
    storage = PooledSqliteEventLogStorage(str(base), open_shards=3)
    runs = [str(uuid.uuid4()) for _ in range(6)]
    for run_id in runs:
        storage.store_event(entry(run_id, "hello"))
    assert storage.open_engines == 3  # the least recently used were closed
    assert len(storage.get_logs_for_run(runs[0])) == 1  # and reopen on demand
    storage.wipe()
    assert not list(base.glob("*-*-*.db"))
    # runs[0]'s connection was open: kept across the wipe, it would write into the deleted
    # file. This event must land in a new one.
    storage.store_event(entry(runs[0], "after"))
    stock = SqliteEventLogStorage(str(base))
    assert [e.user_message for e in stock.get_logs_for_run(runs[0])] == ["after"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_opens_its_own_connections(tmp_path: Path) -> None:
    base = tmp_path / "runs"
    storage = PooledSqliteEventLogStorage(str(base))
    run_id = str(uuid.uuid4())
    storage.store_event(entry(run_id, "parent"))
    pid = os.fork()
    if pid == 0:  # the child: the inherited connection is forgotten, a new one is opened
        code = 1
        try:
            code = 0 if not storage.open_engines else 3
            storage.store_event(entry(run_id, "child"))
        finally:
            os._exit(code)
    _pid, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    storage.store_event(entry(run_id, "parent again"))  # the parent's connection still works
    stock = SqliteEventLogStorage(str(base))
    messages = [e.user_message for e in stock.get_logs_for_run(run_id)]
    assert messages == ["parent", "child", "parent again"]


def _schema(path: Path) -> tuple[list[tuple[str, str, str]], list[tuple[str]], str]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        objects = conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY 2"
        ).fetchall()
        stamped = conn.execute("SELECT version_num FROM alembic_version").fetchall()
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    return objects, stamped, mode


def test_a_new_run_shard_is_what_dagster_itself_makes(tmp_path: Path) -> None:
    # New shards are copies of one empty shard made by Dagster's own _initdb (which reads
    # every migration script for each run): the same tables, indexes, stamp and WAL mode.
    pooled = PooledSqliteEventLogStorage(str(tmp_path / "pooled"))
    stock = SqliteEventLogStorage(str(tmp_path / "stock"))
    for n in range(2):  # the second is a copy in any case
        run_id = str(uuid.uuid4())
        pooled.store_event(entry(run_id, "hello"))
        stock.store_event(entry(run_id, "hello"))
        ours, theirs = Path(pooled.path_for_shard(run_id)), Path(stock.path_for_shard(run_id))
        pooled.dispose()  # closed, so the file alone holds the shard
        assert _schema(ours) == _schema(theirs), n
        assert _schema(ours)[1], "alembic revision stamped"
        assert [e.user_message for e in stock.get_logs_for_run(run_id)] == ["hello"]
    assert not [p.name for p in (tmp_path / "pooled").iterdir() if p.name.endswith(".new")]


def test_a_process_killed_placing_a_shard_leaves_nothing_for_long(tmp_path: Path) -> None:
    # A SIGKILL inside _place_new_shard leaves its temporary files; the next process that
    # makes a shard there removes those of processes that are gone, never a live one's.
    base = tmp_path / "shards"
    base.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    left = [
        f"{uuid.uuid4()}.db.{gone.pid}.new",
        f".empty-shard.{gone.pid}.db",
        f".empty-shard.{gone.pid}.db-wal",
        f".empty-shard.{gone.pid}.db-shm",
    ]
    live = [f"{uuid.uuid4()}.db.{os.getppid()}.new", f".empty-shard.{os.getppid()}.db"]
    for name in [*left, *live, "notes.new", ".empty-shard.x.db"]:
        (base / name).write_bytes(b"partial")
    pooled = PooledSqliteEventLogStorage(str(base))
    run_id = str(uuid.uuid4())
    pooled.store_event(entry(run_id, "hello"))
    pooled.dispose()
    names = {p.name for p in base.iterdir()}
    assert not names & set(left)
    assert names >= {*live, "notes.new", ".empty-shard.x.db", f"{run_id}.db"}


def _materialisation(run_id: str, partition: str) -> EventLogEntry:
    data = StepMaterializationData(
        dg.AssetMaterialization(asset_key="labels", partition=partition, tags={"k": "v"})
    )
    return dagster_entry(run_id, DagsterEventType.ASSET_MATERIALIZATION, data)


@contextlib.contextmanager
def _commits() -> Iterator[list[str]]:
    """The URL of each engine's commit while the block runs, in order."""
    commits: list[str] = []

    def count(conn: sa.Connection) -> None:
        commits.append(str(conn.engine.url))

    sa.event.listen(sa.Engine, "commit", count)
    try:
        yield commits
    finally:
        sa.event.remove(sa.Engine, "commit", count)


def _stored(storage: SqliteEventLogStorage) -> tuple[set[str], int]:
    records = storage.get_event_records(
        dg.EventRecordsFilter(dg.DagsterEventType.ASSET_MATERIALIZATION, asset_key=LABELS),
        limit=1000,
    )
    partitions = {r.partition_key for r in records if r.partition_key}
    return partitions, len(records)


def _asset_row(storage: SqliteEventLogStorage) -> tuple[str | None, int, str | None]:
    """The asset table's row of ``labels``: its last materialisation's partition and storage
    id, and its last run."""
    (record,) = storage.get_asset_records([LABELS])
    last = record.asset_entry.last_materialization_record
    assert last is not None
    return last.partition_key, last.storage_id, record.asset_entry.last_run_id


def test_a_batch_is_one_transaction_a_shard_and_stores_what_one_by_one_does(
    tmp_path: Path,
) -> None:
    with _commits() as commits:
        one = PooledSqliteEventLogStorage(str(tmp_path / "one"))
        batched = PooledSqliteEventLogStorage(str(tmp_path / "batched"))
        run_id = str(uuid.uuid4())
        events = [_materialisation(run_id, f"s00|t{i:03d}") for i in range(50)]
        for storage in (one, batched):
            storage.store_event(entry(run_id, "start"))  # shards and tables exist
        commits.clear()
        for event in events:
            one.store_event(event)
        singly = len(commits)
        commits.clear()
        batched.store_event_batch(events)
        assert len(commits) == 2 and singly >= 100  # a run shard and the index vs. each event
        assert _stored(batched) == _stored(one) == ({f"s00|t{i:03d}" for i in range(50)}, 50)
        assert batched.get_materialized_partitions(LABELS) == one.get_materialized_partitions(
            LABELS
        )
        # The asset's row is written once for the batch, and ends as one event at a time left it.
        assert _asset_row(batched) == _asset_row(one)
        assert _asset_row(one)[0] == events[-1].dagster_event.partition  # type: ignore[union-attr]
        one.dispose()
        batched.dispose()


def test_a_batch_is_serialised_before_it_locks_a_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another run process waits for the index's write lock while a batch holds it: the
    # events' serialisation, most of a batch's work, must not happen under it.
    storage = PooledSqliteEventLogStorage(str(tmp_path))
    run_id = str(uuid.uuid4())
    storage.store_event(entry(run_id, "start"))
    real = sqlite_event_log.event_row
    open_shards: list[int] = []

    def to_row(event: EventLogEntry) -> dict[str, Any]:
        open_shards.append(len(storage._batch or {}))
        return real(event)

    monkeypatch.setattr(sqlite_event_log, "event_row", to_row)
    events = [_materialisation(run_id, f"s00|t{i:03d}") for i in range(5)]
    _run_id, _planned, evaluations = check_run(3)
    storage.store_event_batch(events)
    for event in evaluations:
        storage.store_event(event)
    storage.store_event(entry(run_id, "the step's next event"))
    assert open_shards == [0] * (len(events) + len(evaluations) + 1)
    assert _stored(storage) == ({f"s00|t{i:03d}" for i in range(5)}, 5)
    storage.dispose()


@pytest.mark.parametrize("failing", ["store_event", "_store_asset_event_tags"])
def test_a_batch_that_fails_midway_stores_none_of_its_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    # ``store_event``: an event Dagster stores, after rows of the batch were written;
    # ``_store_asset_event_tags``: after a stretch's event rows were, in both shards.
    storage = PooledSqliteEventLogStorage(str(tmp_path / "runs"))
    run_id = str(uuid.uuid4())
    storage.store_event(entry(run_id, "start"))
    real = getattr(SqliteEventLogStorage, failing)

    def flaky(self: SqliteEventLogStorage, *args: Any) -> None:
        raise OSError("disk full")

    batch = [
        *[_materialisation(run_id, f"p{i}") for i in range(3)],
        entry(run_id, "a log line"),
        *[_materialisation(run_id, f"p{i}") for i in range(3, 5)],
    ]
    monkeypatch.setattr(SqliteEventLogStorage, failing, flaky)
    with pytest.raises(OSError, match="disk full"):
        storage.store_event_batch(batch)
    monkeypatch.setattr(SqliteEventLogStorage, failing, real)
    assert _stored(storage) == (set(), 0)  # all or nothing
    assert run_log(storage, run_id) == ["start"]
    storage.store_event(entry(run_id, "the lock and the shards still work"))
    storage.store_event_batch(batch)
    assert _stored(storage) == ({f"p{i}" for i in range(5)}, 5)
    storage.dispose()


def _table(storage: SqliteEventLogStorage, shard: str, query: str) -> list[tuple[Any, ...]]:
    with storage._connect(shard) as conn:
        return dagster_rows(conn.exec_driver_sql(query))


def test_a_batch_writes_every_table_as_dagster_writes_its_events_one_by_one(
    tmp_path: Path,
) -> None:
    # A batch mixing materialisations (with an indexed tag, of two assets), evaluations and
    # other events: the rows of both shards (ids included), the asset table, the indexed tags
    # and the check rows, as Dagster's own storage leaves them storing the events one by one.
    run_id, planned, evaluations = check_run(4)
    other = dg.AssetKey("other")

    def materialisation(key: dg.AssetKey, partition: str) -> EventLogEntry:
        data = StepMaterializationData(
            dg.AssetMaterialization(
                asset_key=key, partition=partition, tags={DATA_VERSION_TAG: partition, "k": "v"}
            )
        )
        return dagster_entry(run_id, DagsterEventType.ASSET_MATERIALIZATION, data, "labels")

    batch = [
        materialisation(LABELS, "s00|t000"),
        materialisation(other, "x"),
        materialisation(LABELS, "s00|t001"),
        *evaluations[:2],
        entry(run_id, "a log line"),
        *evaluations[2:],
        materialisation(LABELS, "s00|t002"),
        entry(run_id, "the step's next event"),
    ]
    stock = SqliteEventLogStorage(str(tmp_path / "stock"))
    pooled = PooledSqliteEventLogStorage(str(tmp_path / "pooled"))
    start = entry(run_id, "start")
    for storage in (stock, pooled):
        storage.store_event(start)
        storage.store_event(planned)
    for event in batch:
        stock.store_event(event)
    pooled.store_event_batch(batch)
    events = "SELECT * FROM event_logs ORDER BY id"
    for shard in (run_id, "index"):
        assert _table(pooled, shard, events) == _table(stock, shard, events)
    tags = "SELECT * FROM asset_event_tags ORDER BY id"
    assert _table(pooled, "index", tags) == _table(stock, "index", tags)
    # An asset's row: written once a batch, by its last event (so the assets' rows may be
    # created in another order: their ids are not compared).
    assets = f"SELECT {ASSET_ROW} FROM asset_keys ORDER BY asset_key"
    assert _table(pooled, "index", assets) == _table(stock, "index", assets)
    assert len(_table(pooled, "index", "SELECT * FROM asset_event_tags")) == 4
    assert check_rows(pooled) == check_rows(stock)
    assert {r[4] for r in check_rows(pooled)} == {"SUCCEEDED", "FAILED"}
    stock.dispose()
    pooled.dispose()


def test_every_shard_commits_in_wal_mode_without_an_fsync_a_commit(tmp_path: Path) -> None:
    storage = PooledSqliteEventLogStorage(str(tmp_path / "runs"))
    run_id = str(uuid.uuid4())
    storage.store_event(entry(run_id, "hello"))
    for shard in (run_id, "index"):
        with storage._connect(shard) as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar_one() == "wal"
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar_one() == 1  # NORMAL
    storage.dispose()


def test_check_rows_are_what_dagsters_own_storage_writes_in_fewer_commits(
    tmp_path: Path,
) -> None:
    run = check_run(20)
    keys = [e.get_dagster_event().event_specific_data.partition for e in run[2]]
    stock = SqliteEventLogStorage(str(tmp_path / "stock"))
    pooled = PooledSqliteEventLogStorage(str(tmp_path / "pooled"))
    with _commits() as commits:
        both = store_beside_stock(stock, pooled, run, commits)
    rows = both.rows
    assert [r[2] for r in rows] == keys and {r[4] for r in rows} == {"SUCCEEDED", "FAILED"}
    # Dagster commits an evaluation's run shard, index row and planned-row update apart; the
    # pooled storage holds them for the next event and commits all in one transaction a shard.
    assert both.held == {"stock": 3 * len(keys), "ours": 0}
    assert both.spent == {"stock": 3 * len(keys) + 1, "ours": 2}
    info = pooled.get_asset_check_partition_info([dg.AssetCheckKey(LABELS, "integrity")])
    assert {i.partition_key for i in info} == set(keys)
    stock.dispose()
    pooled.dispose()


def test_held_evaluations_are_written_at_the_cap_at_dispose_and_at_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(check_executions, "HELD_MAX", 5)
    _run_id, planned, evaluations = check_run(12)
    pooled = PooledSqliteEventLogStorage(str(tmp_path))
    pooled.store_event(planned)
    for event in evaluations:
        pooled.store_event(event)
    statuses = [r[4] for r in check_rows(pooled)]
    assert statuses.count("PLANNED") == 2  # two full rounds of 5 written, 2 held
    pooled.dispose()
    reader = SqliteEventLogStorage(str(tmp_path))
    assert "PLANNED" not in [r[4] for r in check_rows(reader)]
    reader.dispose()
    # At exit (``close_event_logs``, which the CLI runs before it leaves) in a process that
    # never disposed of its storage.
    _run_id, planned, evaluations = check_run(3)
    script = (
        "import pickle, sys\n"
        "from backfill_assets.accelerators.sqlite_event_log import PooledSqliteEventLogStorage\n"
        "from backfill_assets.accelerators.sqlite_event_log import close_event_logs\n"
        "storage = PooledSqliteEventLogStorage(sys.argv[1])\n"
        "for event in pickle.load(sys.stdin.buffer):\n"
        "    storage.store_event(event)\n"
        "close_event_logs()\n"
    )
    other = tmp_path / "other"
    subprocess.run(
        [sys.executable, "-c", script, str(other)],
        input=pickle.dumps([planned, *evaluations]),
        check=True,
    )
    reader = SqliteEventLogStorage(str(other))
    assert sorted(r[4] for r in check_rows(reader)) == ["FAILED", "SUCCEEDED", "SUCCEEDED"]
    reader.dispose()


def test_an_evaluation_reported_outside_a_step_is_written_at_once(tmp_path: Path) -> None:
    # The UI or a sensor reporting a check: no next event of its step is coming.
    run_id, _planned, evaluations = check_run(1)
    data = evaluations[0].get_dagster_event().event_specific_data
    pooled = PooledSqliteEventLogStorage(str(tmp_path))
    pooled.store_event(check_event(run_id, data, step_key=None))
    reader = SqliteEventLogStorage(str(tmp_path))
    assert [r[4] for r in check_rows(reader)] == ["FAILED"]
    reader.dispose()
    pooled.dispose()


def test_an_evaluation_without_a_planned_row_is_inserted_as_dagster_does(tmp_path: Path) -> None:
    # No planned event (Dagster: a step launcher's run): the update finds no row, so Dagster's
    # own path inserts it; an unpartitioned evaluation goes that way too.
    run_id, _planned, evaluations = check_run(3)
    unpartitioned = dg.AssetCheckEvaluation(asset_key=LABELS, check_name="integrity", passed=True)
    events = [*evaluations, check_event(run_id, unpartitioned)]
    stock = SqliteEventLogStorage(str(tmp_path / "stock"))
    pooled = PooledSqliteEventLogStorage(str(tmp_path / "pooled"))
    for storage in (stock, pooled):
        for event in events:
            storage.store_event(event)
        storage.store_event(entry(run_id, "the step's next event"))
    rows = check_rows(pooled)
    assert rows == check_rows(stock)
    assert len(rows) == 4
    stock.dispose()
    pooled.dispose()
