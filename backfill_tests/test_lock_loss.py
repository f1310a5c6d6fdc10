"""A run that loses its writer lock mid-run stops and fails instead of writing on unnoticed.

PostgreSQL: the advisory locks live on one connection; ``pg_terminate_backend`` (or a proxy or
network drop) ends that session and the server frees the locks, while the run's writer lanes,
on other connections, kept going. SQLite: the lock file deleted under a live run (a cleanup
script) lets the next writer lock a fresh file.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.dispatch.pipeline import RunOptions
from backfill_assets.providers.models.fake import FakeModel
from backfill_assets.store.work import LOCK_CHECK_SECONDS, LockLost, WriterLocks, lock_dir
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


def _drop_lock(engine: Engine) -> None:
    """Take the running run's lock away, the way it happens in production, once it calls."""
    for _ in range(500):
        if count(engine, "SELECT count(*) FROM ledger_events WHERE type = 'attempt'"):
            break
        time.sleep(0.02)
    if engine.dialect.name == "sqlite":
        folder = lock_dir(str(engine.url.database))
        for _ in range(200):
            files = list(folder.glob("acme.*.lock")) if folder.exists() else []
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


def test_a_lost_writer_lock_stops_the_run(engine: Engine, tmp_path: Path) -> None:
    records = [{"tenant_id": "acme", "post_id": f"p{i}", "text": f"post {i}"} for i in range(POSTS)]
    import_records(engine, tmp_path, records)
    # 240 x 100 ms / 2 = 12 s of calls: the lock is lost near the start.
    slow = FakeModel(latency_ms=100)
    options = RunOptions(concurrency=2, retry=FAST_RETRY, seed=1)
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
    # While the run still believes it holds the partition, another writer can take it.
    with WriterLocks(engine) as locks:
        locks.acquire("acme", refs_for(["acme"])[0].slice)
    worker.join(timeout=60)
    stopped_after = time.monotonic() - lost_at
    assert not worker.is_alive()
    assert failure and isinstance(failure[0], LockLost), failure
    assert "lost mid-run" in str(failure[0])
    assert stopped_after < LOCK_CHECK_SECONDS + 5.0  # generous: a shared, busy machine
    attempts = count(engine, "SELECT count(*) FROM ledger_events WHERE type = 'attempt'")
    assert attempts < POSTS / 2  # it stopped sending, well before the end
    # What was paid is booked, and nothing in the store is foreign or doubled.
    outcome = verify(engine)
    assert not outcome.blocking(require_complete=False), outcome.as_dict()
    # A new run (with its locks) finishes the rest.
    run(engine, ["acme"])
    assert verify(engine).as_dict(require_complete=True)["ok"]


@pytest.mark.parametrize("url", ["sqlite://"])
def test_in_memory_locks_are_never_lost(url: str) -> None:
    from backfill_assets.store.work import WriterLocks

    with WriterLocks(sa.create_engine(url)) as locks:
        locks.acquire("acme", 0)
        assert locks.lost() == []
