"""A run that loses its writer lock commits nothing more for its partitions, stops and fails.

PostgreSQL: the advisory locks live on one connection, which also carries every commit of
results, dead letters and usage (the fence). ``pg_terminate_backend`` (or a proxy, or the
server giving up on a silent host) ends that session and the server frees the locks while the
run's attempt lane, on another connection, goes on. SQLite: the lock file deleted under a live
run (a cleanup script) lets the next writer lock a fresh file.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.config.variables import RunSettings
from backfill_assets.dispatch.pipeline import RunOptions
from backfill_assets.ledger.engine import write_tx
from backfill_assets.ledger.locks.fence import LockLost, PartitionBusy
from backfill_assets.ledger.locks.sqlite_files import RANGE_LOCK_FILE, lock_dir
from backfill_assets.ledger.locks.writer_locks import LOCK_CHECK_SECONDS, WriterLocks
from backfill_assets.ledger.tables import limiter_members
from backfill_assets.providers.models.fake import FakeModel
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import FAST_RETRY, count, refs_for, run, verify

POSTS = 240


def _lock_holder_pid(engine: Engine) -> int | None:
    with engine.connect() as conn:
        pid = conn.execute(
            sa.text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND database ="
                " (SELECT oid FROM pg_database WHERE datname = current_database()) LIMIT 1"
            )
        ).scalar()
    return None if pid is None else int(pid)


def _drop_lock(engine: Engine, wait_for_calls: bool = True) -> None:
    """Take the running run's lock away, the way it happens in production, once it calls."""
    for _ in range(500 if wait_for_calls else 0):
        if count(engine, "SELECT count(*) FROM ledger_events WHERE type = 'attempt'"):
            break
        time.sleep(0.02)
    if engine.dialect.name == "sqlite":
        folder = lock_dir(str(engine.url.database))
        for _ in range(200):
            # One lock file for every partition (Linux), else one a partition.
            names = ("acme.*.lock", RANGE_LOCK_FILE)
            files = [f for n in names for f in folder.glob(n)] if folder.exists() else []
            if files:
                for f in files:
                    os.unlink(f)
                return
            time.sleep(0.02)
        raise AssertionError("the run never took its lock")
    for _ in range(200):
        pid = _lock_holder_pid(engine)
        if pid is not None:
            with engine.connect() as conn:
                # Wait (up to 5 s) until the backend is gone: without a timeout the call only
                # signals it, and the lock can still be held when the test takes it.
                conn.execute(sa.text("SELECT pg_terminate_backend(:p, 5000)"), {"p": pid})
            return
        time.sleep(0.02)
    raise AssertionError("the run never took its lock")


def _committed(engine: Engine) -> tuple[int, int, int]:
    """Results, dead letters and usage events, read after any commit under way (on SQLite a
    write transaction waits for the writer's; on PostgreSQL the writer's session is gone)."""
    with write_tx(engine) as conn:
        return tuple(  # type: ignore[return-value]
            int(conn.execute(sa.text(sql)).scalar_one())
            for sql in (
                "SELECT count(*) FROM results",
                "SELECT count(*) FROM dead_letters",
                "SELECT count(*) FROM ledger_events WHERE type = 'usage'",
            )
        )


def test_a_lost_writer_lock_stops_the_run_and_nothing_more_commits(
    engine: Engine, tmp_path: Path
) -> None:
    records = [{"tenant_id": "acme", "post_id": f"p{i}", "text": f"post {i}"} for i in range(POSTS)]
    import_records(engine, tmp_path, records)
    # 240 x 100 ms / 2 = 12 s of calls: the lock is lost near the start.
    slow = FakeModel(latency_ms=100)
    options = RunOptions(run=RunSettings(concurrency=2), retry=FAST_RETRY, seed=1)
    failure: list[BaseException] = []

    def go() -> None:
        try:
            run(engine, ["acme"], adapter=slow, options=options)
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=go)
    worker.start()
    _drop_lock(engine)
    lost_at = time.monotonic()
    # While the run still believes it holds the partition, another writer takes it over.
    with WriterLocks(engine) as locks:
        locks.acquire("acme", refs_for(["acme"])[0].slice)
        at_takeover = _committed(engine)
        worker.join(timeout=60)
        stopped_after = time.monotonic() - lost_at
        assert not worker.is_alive()
        # Not one result, dead letter or usage event of the old writer after the takeover,
        # though its calls in flight were paid for (they show as orphan attempts).
        assert _committed(engine) == at_takeover
    assert failure and isinstance(failure[0], LockLost), failure
    assert "taken over" in str(failure[0]) and "acme.s00" in str(failure[0])
    assert stopped_after < LOCK_CHECK_SECONDS + 5.0  # generous: a shared, busy machine
    attempts = count(engine, "SELECT count(*) FROM ledger_events WHERE type = 'attempt'")
    assert attempts < POSTS / 2  # it stopped sending, well before the end
    # Nothing in the store is foreign or doubled.
    outcome = verify(engine)
    assert not outcome.blocking(require_complete=False), outcome.as_dict()
    # A new run (with its locks) finishes the rest.
    run(engine, ["acme"])
    assert verify(engine).as_dict(require_complete=True)["ok"]


def _member(name: str) -> dict[str, object]:
    # Any row will do: the fence guards the transaction, whatever it writes.
    return {"endpoint": "e", "member": name, "weight": 1.0, "heartbeat_at": 0.0}


def test_the_fence_refuses_a_commit_once_another_writer_holds_the_lock(engine: Engine) -> None:
    first = WriterLocks(engine)
    first.acquire("acme", 0)
    with first.transaction() as conn:  # held: commits
        conn.execute(limiter_members.insert().values(_member("before")))
    _drop_lock(engine, wait_for_calls=False)
    with WriterLocks(engine) as second:
        second.acquire("acme", 0)
        with pytest.raises(LockLost) as lost, first.transaction() as conn:
            conn.execute(limiter_members.insert().values(_member("after")))
        message = str(lost.value)
        assert "acme.s00" in message and "taken over" in message
        if engine.dialect.name == "postgresql":
            # The new holder is named: who it is in pg_stat_activity.
            assert "taken over by another writer (backend " in message, message
            assert "'backfill-moderation " in message
        first.release_all()
    assert count(engine, "SELECT count(*) FROM limiter_members WHERE member = 'after'") == 0
    assert count(engine, "SELECT count(*) FROM limiter_members WHERE member = 'before'") == 1


@pytest.mark.parametrize("url", ["sqlite://"])
def test_in_memory_locks_are_never_lost(url: str) -> None:
    with WriterLocks(sa.create_engine(url)) as locks:
        locks.acquire("acme", 0)
        assert locks.lost() == []


def test_no_lock_is_taken_once_the_session_holding_ours_is_gone(engine: Engine) -> None:
    if engine.dialect.name == "sqlite":
        pytest.skip("a lock file cannot lose its session")
    locks = WriterLocks(engine)
    locks.acquire("acme", 0)
    _drop_lock(engine, wait_for_calls=False)  # the server ends the session holding it
    for slice_no in (1, 2):  # on the broken connection, then on the one it leaves behind
        with pytest.raises(LockLost, match=r"acme\.s0"):
            locks.acquire("acme", slice_no)
    assert _lock_holder_pid(engine) is None  # nothing was taken on a new session either
    assert locks.lost() == ["acme.s00"]
    locks.release_all()


def test_a_run_takes_its_partitions_locks_together(engine: Engine) -> None:
    # PostgreSQL: one statement for them all (one a partition was 30,000 round trips for
    # 10,000 small tenants); both stores: the busy ones are named, the others taken.
    takes: list[str] = []

    def seen(_c: object, _cur: object, statement: str, *_a: object) -> None:
        if "lock" in statement:
            takes.append(statement)

    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        with WriterLocks(engine) as first:
            assert first.acquire_many([("acme", 0), ("acme", 1), ("acme", 0)]) == {}
            pg_takes = len(takes)
            with WriterLocks(engine) as second:
                busy = second.acquire_many([("acme", 1), ("globex", 0), ("acme", 2)])
                assert list(busy) == [("acme", 1)] and "s01" in busy[("acme", 1)]
                with pytest.raises(PartitionBusy):
                    second.acquire("acme", 0)
                with pytest.raises(ValueError):  # before any lock is taken
                    second.acquire_many([("initech", 0), ("Bad Id", 0)])
            with WriterLocks(engine) as third:  # the second released globex and acme s02
                assert third.acquire_many([("globex", 0), ("acme", 2), ("initech", 0)]) == {}
    finally:
        sa.event.remove(engine, "before_cursor_execute", seen)
    if engine.dialect.name == "postgresql":
        assert pg_takes == 1, takes
    with WriterLocks(engine) as after:  # all released
        assert after.acquire_many([("acme", 0), ("acme", 1), ("initech", 0)]) == {}
