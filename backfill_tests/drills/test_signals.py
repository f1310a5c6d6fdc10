"""SIGTERM and SIGINT stop ``run`` cleanly: finished work committed, the Dagster run
canceled, exit non-zero within 10 s; the next run finishes the rest."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from backfill_assets.ledger.engines import engine_for
from backfill_tests.cli_runs import clean_env
from backfill_tests.conftest import import_records

# One worker runs the tests that start servers or time a stop, one after another (bin/test).
pytestmark = pytest.mark.xdist_group("servers")


def _cli(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "backfill_assets.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_run_commits_and_cancels(tmp_path: Path, signum: int) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = engine_for(url)
    records = [
        {"tenant_id": "acme", "post_id": f"p{i}", "text": f"post number {i}"} for i in range(2000)
    ]
    import_records(engine, tmp_path, records)
    env = clean_env(
        DAGSTER_HOME=str(tmp_path / "home"),
        BACKFILL_DATABASE_URL=url,
        BACKFILL_FAKE_LATENCY_MS="40",
    )
    proc = _cli(["run", "--json"], env)
    deadline = time.monotonic() + 120
    with engine.connect() as conn:
        while conn.execute(sa.text("SELECT count(*) FROM results")).scalar_one() < 50:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
            conn.rollback()
    sent = time.monotonic()
    proc.send_signal(signum)
    _out, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 10
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err
    with engine.connect() as conn:
        done = conn.execute(sa.text("SELECT count(*) FROM results")).scalar_one()
        usage = conn.execute(
            sa.text("SELECT count(*) FROM ledger_events WHERE type = 'usage'")
        ).scalar_one()
    # What finished is committed with its usage. Usage is booked before the answer is
    # parsed, so a signal between the two leaves a paid call with no result yet: at most
    # the calls in flight, which the next run re-pays.
    assert 50 <= done < 2000 and done <= usage <= done + 64
    instance = dg.DagsterInstance.from_config(str(tmp_path / "home"))
    with instance:
        statuses = {r.dagster_run.status for r in instance.get_run_records()}
    assert statuses == {dg.DagsterRunStatus.CANCELED}
    again = _cli(["run", "--json"], env)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-2000:]
    assert json.loads(out)["totals"]["model_calls"] <= 2000 - done + 64
    verify = _cli(["verify", "--require-complete", "--json"], env)
    verify.communicate(timeout=120)
    assert verify.returncode == 0
