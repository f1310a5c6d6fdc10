"""The CLI process ends without the interpreter's teardown, and loses nothing by it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def _python(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


def test_output_hooks_and_the_store_are_finished_before_the_process_ends(tmp_path: Path) -> None:
    done = _python(
        f"""
        import atexit, logging, sys
        import sqlalchemy as sa
        from backfill_assets.cli.process import exit_process
        from backfill_assets.ledger.engines import engine_for

        from backfill_assets.accelerators.sqlite_event_log import PooledSqliteEventLogStorage
        from dagster._core.events.log import EventLogEntry

        engine = engine_for("sqlite:///{tmp_path / "store.db"}")
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE t (x INTEGER)"))
            conn.execute(sa.text("INSERT INTO t VALUES (1)"))
        events = PooledSqliteEventLogStorage("{tmp_path / "runs"}")
        events.store_event(EventLogEntry(
            error_info=None, level="INFO", user_message="kept", run_id="r1", timestamp=1.0
        ))
        logging.basicConfig(filename="{tmp_path / "log.txt"}")
        logging.warning("logged")
        atexit.register(lambda: print("hook ran"))
        sys.stdout.write("x" * 200_000)  # more than a pipe holds: buffered until the flush
        sys.stderr.write("to stderr")
        exit_process(3)
        """,
        tmp_path,
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "x" * 200_000 + "hook ran\n"
    assert done.stderr == "to stderr"
    assert "logged" in (tmp_path / "log.txt").read_text()
    # The store's connections were closed: SQLite checkpointed its write-ahead log. So were
    # the embedded Dagster instance's event log connections, which a run keeps open.
    assert not (tmp_path / "store.db-wal").exists()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["index.db", "r1.db"]


def test_a_thread_still_working_is_waited_for(tmp_path: Path) -> None:
    done = _python(
        """
        import threading, time
        from backfill_assets.cli.process import exit_process

        def work():
            time.sleep(0.5)
            print("thread finished", flush=True)

        threading.Thread(target=work).start()
        exit_process(0)
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "thread finished\n"


def test_the_command_exits_with_its_code() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "backfill_assets.cli", "rejects", "--bogus"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "unrecognized arguments" in done.stderr
