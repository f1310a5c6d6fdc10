"""The production deployment for real: ``bin/prod`` (webserver + daemon) on a fresh PostgreSQL
instance and store, backfills launched through GraphQL, run by the daemon's run workers.

Marker ``pg``: under CI=true an unreachable PostgreSQL fails these tests instead of skipping.
The shipped instance has the backfill daemon look at backfills every 2 s instead of Dagster's
constant 30 s (docs/operations.md, "Daemon settings"): the backfills' runs are created within
seconds of the launch and the backfills closed within seconds of their runs' end.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import suppress
from pathlib import Path

import dagster as dg
import httpx
import pytest

from backfill_assets.cli import main as cli_main
from backfill_tests.cli_runs import ROOT, clean_env, clear_settings, last_json
from backfill_tests.conftest import dispose_engine, pg_database
from backfill_tests.sessions import kill_sessions, session_pids, start_session

# One worker runs the tests that start servers or time a stop, one after another (bin/test).
pytestmark = pytest.mark.xdist_group("servers")

PROD = ROOT / "bin" / "prod"
# Two tenants, two concurrent run workers (on 2 cores a third only slows the runs).
TENANTS = ["acme", "globex"]
WAIT_SECONDS = 150  # generous: a loaded machine makes the test slow, not red
_READY_QUERY = '{ assetNodeOrError(assetKey: {path: ["moderation_labels"]}) { __typename } }'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def session_states(sid: int) -> str:
    """Each live process of a session: pid, state, what it waits in, its command (for a stop
    that did not happen: a stopped, blocked or busy process shows here)."""
    lines = []
    for pid in session_pids(sid):
        with suppress(OSError):
            proc = Path(f"/proc/{pid}")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = (proc / "wchan").read_text().strip() or "-"
            masks = " ".join(
                line.replace(":\t", "=")
                for line in (proc / "status").read_text().splitlines()
                if line.startswith(("SigBlk", "SigIgn", "SigCgt"))
            )
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:100]
            lines.append(f"{pid} {state} {wchan} {masks} {cmd}")
    return "\n".join(lines)


def start(args: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``bin/prod ...`` in a session of its own, as a process manager would."""
    return start_session([str(PROD), *args], env, ROOT, log, append=True)


def wait_ready(base_url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Until the webserver serves the asset graph (``bin/prod``'s preflight has run by then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        with suppress(httpx.HTTPError, KeyError, TypeError):
            resp = httpx.post(f"{base_url}/graphql", json={"query": _READY_QUERY}, timeout=5)
            if resp.json()["data"]["assetNodeOrError"]["__typename"] == "AssetNode":
                return
        time.sleep(0.25)
    raise AssertionError(f"webserver not ready in {timeout}s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes], sig: int, timeout: float) -> tuple[int | None, float]:
    """Signal a session leader as a process manager would; its exit code and the time taken."""
    t = time.monotonic()
    if proc.poll() is None:
        proc.send_signal(sig)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)
    return proc.poll(), time.monotonic() - t


def prod_env(instance_url: str, store_url: str, home: Path, port: int) -> dict[str, str]:
    env = clean_env()
    env.update(
        DAGSTER_PG_URL=instance_url,
        BACKFILL_DATABASE_URL=store_url,
        DAGSTER_HOME=str(home),
        HOST="127.0.0.1",
        PORT=str(port),
        STOP_GRACE_SECONDS="20",
    )
    return env


@pytest.fixture
def pg_pair(pg_available: bool) -> Iterator[tuple[str, str]]:
    """A fresh instance database (psycopg2 URL) and store database (plain postgresql:// URL)."""
    if not pg_available:
        pytest.skip("PostgreSQL not available (set BACKFILL_TEST_PG_URL)")
    with pg_database("bf_dagster") as instance_url, pg_database("bf_store") as store:
        store_url = store.replace("postgresql+psycopg2://", "postgresql://", 1)
        try:
            yield instance_url, store_url
        finally:
            dispose_engine(store_url)


def _timeline(instance: dg.DagsterInstance, records: Sequence[dg.RunRecord], epoch: float) -> str:
    """When the daemon created, started and ended each run, and closed the backfills."""
    created = min(r.create_timestamp.timestamp() for r in records) - epoch
    runs = "; ".join(
        f"{r.dagster_run.tags.get('tenant')} {(r.start_time or 0) - epoch:.1f}"
        f"-{(r.end_time or 0) - epoch:.1f}s"
        for r in sorted(records, key=lambda r: r.start_time or 0)
    )
    closed = max(b.backfill_end_timestamp or 0 for b in instance.get_backfills()) - epoch
    return f"runs created {created:.1f}s, ran {runs}, backfills closed {closed:.1f}s"


@pytest.mark.pg
def test_prod_daemon_backfill_on_postgres(
    pg_pair: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    instance_url, store_url = pg_pair
    home = tmp_path / "home"
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    env = prod_env(instance_url, store_url, home, port)
    # The in-process CLI calls below see the same settings as the servers.
    clear_settings(monkeypatch)
    for k in ("DAGSTER_PG_URL", "BACKFILL_DATABASE_URL", "DAGSTER_HOME"):
        monkeypatch.setenv(k, env[k])
    timings: dict[str, float] = {}
    log = tmp_path / "prod.log"
    t0 = time.monotonic()
    prod = start([], env, log)
    try:
        export = tmp_path / "export.jsonl"  # written while the servers start
        assert cli_main(["demo-data", "--out", str(export), "--tenants", str(len(TENANTS)),
                         "--posts", "30"]) == 0  # fmt: skip
        wait_ready(base_url, prod, log, timeout=90)
        timings["start"] = time.monotonic() - t0
        processes = session_pids(prod.pid)
        # bin/prod, webserver, daemon, and the webserver's code server (it serves the graph).
        assert len(processes) >= 4, processes

        # The import registers the tenants as partitions in the PostgreSQL instance that
        # bin/prod installed in DAGSTER_HOME.
        assert cli_main(["import", str(export), "--json"]) == 0
        imported = last_json(capsys.readouterr().out)
        assert imported["new_tenants"] == TENANTS and imported["rejected"] > 0

        launch_epoch, t = time.time(), time.monotonic()
        launched = subprocess.run(
            [sys.executable, "-m", "backfill_assets.cli", "launch", "--missing", "--json",
             "--wait", str(WAIT_SECONDS), "--url", base_url],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=WAIT_SECONDS + 60,
        )  # fmt: skip
        timings["launch_to_done"] = time.monotonic() - t
        assert launched.returncode == 0, f"{launched.stderr[-2000:]}\n{log.read_text()[-3000:]}"
        doc = json.loads(launched.stdout)
        # 30 posts a tenant fill one partition each, and only that one is registered: launch
        # has nothing to leave out.
        assert doc["partitions"] == len(TENANTS) and doc["left_out"] == 0
        backfills = {b["tenant"]: b for b in doc["backfills"]}
        assert sorted(backfills) == TENANTS
        assert {b["status"] for b in backfills.values()} == {"COMPLETED_SUCCESS"}

        with dg.DagsterInstance.from_config(str(home)) as instance:
            assert type(instance.run_storage).__name__ == "KnownSchemaPostgresRunStorage"
            assert type(instance.event_log_storage).__name__ == "BatchingPostgresEventLogStorage"
            queue = instance.get_concurrency_config().run_queue_config
            assert queue is not None and queue.tag_concurrency_limits[0]["key"] == "tenant"
            records = instance.get_run_records()
            timeline = _timeline(instance, records, launch_epoch)
            every = [r.dagster_run for r in records]
            failed = {
                str(r.asset_selection): [
                    str(
                        getattr(e.dagster_event.event_specific_data, "error", None)
                        or e.user_message
                    )
                    for e in instance.all_logs(r.run_id)
                    if e.dagster_event and e.dagster_event.is_failure
                ]
                for r in every
                if r.status == dg.DagsterRunStatus.FAILURE
                or ("dagster/backfill" in r.tags and r.status != dg.DagsterRunStatus.SUCCESS)
            }
            assert not failed, failed
            # The rest are the reporting sensor's refreshes (backfill_plan, tenant_usage,
            # review_queue).
            runs = [r for r in every if "dagster/backfill" in r.tags]
            reporting = {dg.AssetKey(k) for k in ("backfill_plan", "tenant_usage", "review_queue")}
            others = [r for r in every if r not in runs]
            assert all(r.asset_selection and r.asset_selection <= reporting for r in others)
            # multi_run(16): one run per tenant's backfill, each tagged for the run queue.
            assert len(runs) == len(TENANTS)
            assert sorted(r.tags["tenant"] for r in runs) == TENANTS
            assert {r.tags["dagster/backfill"] for r in runs} == {
                b["backfill_id"] for b in backfills.values()
            }
            # Each run in a run-worker process of its own, started under bin/prod.
            workers = set()
            for r in runs:
                for rec in instance.all_logs(r.run_id):
                    found = re.search(
                        r"Executing steps in process \(pid: (\d+)\)", rec.user_message
                    )
                    if found:
                        workers.add(int(found.group(1)))
            assert len(workers) == len(TENANTS) and not workers & set(processes)
            for asset in ("moderation_labels", "applied_labels"):
                done = instance.get_materialized_partitions(dg.AssetKey(asset))
                assert len(done) == len(TENANTS), asset

        assert cli_main(["verify", "--require-complete", "--json"]) == 0
        verified = json.loads(capsys.readouterr().out)
        assert verified["ok"], verified["problems"]
        assert sorted(t["tenant"] for t in verified["tenants"]) == TENANTS
        assert all(
            t["missing"] == 0 and t["done"] == t["expected"] > 0 for t in verified["tenants"]
        )

        # One SIGTERM stops the webserver, the daemon and their code servers.
        code, timings["stop"] = stop(prod, signal.SIGTERM, timeout=40)
        assert code == 143, f"{log.read_text()[-3000:]}\n{session_states(prod.pid)}"
        assert session_pids(prod.pid) == [], "processes left behind by bin/prod"
    finally:
        kill_sessions([prod])
    timings["total"] = time.monotonic() - t0
    with capsys.disabled():
        print("\n[prod daemon] " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
        print(f"[prod daemon] after launch: {timeline}")


@pytest.mark.parametrize(
    ("pg_url", "store_url", "message"),
    [
        ("", "postgresql://h/s", "DAGSTER_PG_URL is not set"),
        ("postgresql://u:s3cr3t@h/d", "postgresql://h/s", "must start with postgresql+psycopg2://"),
        ("postgresql+psycopg2://h/d", "", "BACKFILL_DATABASE_URL is not set"),
        ("postgresql+psycopg2://h/d", "sqlite:///x.db", "must be a PostgreSQL URL"),
    ],
)
def test_prod_refuses_without_postgres(pg_url: str, store_url: str, message: str) -> None:
    env = clean_env()
    env.update(DAGSTER_PG_URL=pg_url, BACKFILL_DATABASE_URL=store_url)
    done = subprocess.run(
        [str(PROD), "check"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert "s3cr3t" not in done.stderr  # the password is redacted


def test_prod_refuses_a_home_with_the_sqlite_instance(tmp_path: Path) -> None:
    """A home first touched by another command (e.g. ``import``) holds the embedded config."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text())
    env = clean_env()
    env.update(
        DAGSTER_PG_URL="postgresql+psycopg2://h/d",
        BACKFILL_DATABASE_URL="postgresql://h/s",
        DAGSTER_HOME=str(home),
    )
    done = subprocess.run(
        [str(PROD), "check"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert "does not keep runs, events and schedules in PostgreSQL" in done.stderr
