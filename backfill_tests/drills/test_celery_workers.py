"""Steps on Celery workers for real: ``bin/prod`` (webserver + daemon) and two ``bin/prod
worker`` processes on PostgreSQL and the machine's RabbitMQ, a backfill launched through the
webserver's GraphQL API (``launch --wait``), its models against the provider simulator.

Shown:
- each run's steps are Celery tasks, and both workers execute them (the ``Celery worker`` of
  dagster-celery's engine events);
- one worker SIGKILLed (its whole process tree) in the middle of a ``moderation_labels`` step:
  the broker gives the step to the other worker (late acknowledgement), the backfill completes,
  ``verify --require-complete`` passes, every partition is applied once;
- the ledger equals the simulator's meter for the tenant never touched, and for the killed
  step's tenant it misses only the calls in flight at the kill, which are all that is re-paid.

Each test gets a RabbitMQ virtual host of its own (``rabbitmqctl``), so no other worker or run
on the broker takes its steps. Needs RabbitMQ on 127.0.0.1:5672 (guest/guest), ``rabbitmqctl``
and PostgreSQL; skipped with the reason without them, except under CI=true, where it must run.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from backfill_assets.ledger.engines import engine_for
from backfill_assets.providersim import MeterSnapshot, SimConfig, Simulator
from backfill_tests.cli_runs import ROOT, clear_settings, last_json
from backfill_tests.conftest import IN_CI, write_jsonl
from backfill_tests.drills.test_prod_daemon import pg_pair, prod_env, stop, wait_ready
from backfill_tests.sessions import kill_session, kill_sessions, session_pids, start_session

__all__ = ["pg_pair"]  # the fixture, shared with the prod daemon drill

pytestmark = [pytest.mark.slow, pytest.mark.pg, pytest.mark.xdist_group("servers")]

PROD = ROOT / "bin" / "prod"
BROKER = ("127.0.0.1", 5672)
# The victim's tenant and the other one: one run each, one step at a time on each worker.
POSTS = {"acme": 300, "globex": 300}
CONCURRENCY = 4
RPM = 1200  # shared by the two runs: ~30 s of sending per tenant
LATENCY_MS = 50
FLUSH_MS = 50
# What a SIGKILL can leave paid but unbooked: the calls in flight and one group commit's
# outcomes (under a second at the run's share of the limit).
IN_FLIGHT_BOUND = CONCURRENCY + RPM // 60
WAIT_SECONDS = 300
DEAD_PEER_S = 3


def _unavailable() -> str | None:
    """Why the broker cannot be used here (None: it can)."""
    if shutil.which("rabbitmqctl") is None:
        return "`rabbitmqctl` is not installed (RabbitMQ)"
    try:
        socket.create_connection(BROKER, timeout=3).close()
    except OSError as exc:
        return f"RabbitMQ is not listening on {BROKER[0]}:{BROKER[1]}: {exc}"
    return None


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture
def vhost() -> Iterator[str]:
    """A RabbitMQ virtual host of the test's own, guest allowed in."""
    reason = _unavailable()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"CI=true but the Celery drill cannot run: {reason}")
        pytest.skip(reason)
    name = f"bf_celery_{uuid.uuid4().hex[:8]}"
    _rabbitmqctl("add_vhost", name)
    try:
        _rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        yield name
    finally:
        with suppress(subprocess.SubprocessError):
            _rabbitmqctl("delete_vhost", name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _step_workers(home: Path) -> list[tuple[str, str, str, float]]:
    """(tenant, step, Celery worker, when) of every step a worker started, in order."""
    found = []
    with dg.DagsterInstance.from_config(str(home)) as instance:
        for record in instance.get_run_records():
            run = record.dagster_run
            if "dagster/backfill" not in run.tags:
                continue
            for entry in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
                event = entry.dagster_event
                data = event.engine_event_data if event else None
                worker = (data.metadata.get("Celery worker") if data else None) or None
                if worker is not None and event is not None:
                    step = (run.tags["tenant"], str(event.step_key), str(worker.value))
                    found.append((*step, entry.timestamp))
    return sorted(found, key=lambda f: f[3])


def _scalar(url: str, sql: str, **params: Any) -> Any:
    with engine_for(url).connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def _pairs(url: str, sql: str, **params: Any) -> dict[str, int]:
    with engine_for(url).connect() as conn:
        return {str(k): int(n) for k, n in conn.execute(sa.text(sql), params).all()}


@dataclass
class Cluster:
    """Where the drill's processes run and what each is told."""

    env: dict[str, str]  # bin/prod (webserver + daemon), the CLI
    workers: dict[str, tuple[list[str], dict[str, str]]]  # name -> argv prefix, environment
    home: Path
    store_url: str
    base_url: str
    logs: Path


@dataclass
class Outcome:
    victim: str
    tenant: str
    node_of: dict[str, str]
    steps: list[tuple[str, str, str, float]]
    meter: MeterSnapshot
    figures: dict[str, Any] = field(default_factory=dict)


def celery_env(env: dict[str, str], broker: str, model_url: str) -> dict[str, str]:
    """``env`` with the Celery executor and the drill's model and limits."""
    return {
        **env,
        "BACKFILL_EXECUTOR": "celery",
        "BACKFILL_CELERY_BROKER_URL": broker,
        "BACKFILL_MODEL_BACKEND": "openai",
        "BACKFILL_MODEL_BASE_URL": model_url,
        "BACKFILL_CONCURRENCY": str(CONCURRENCY),
        "BACKFILL_RPM": str(RPM),
        "BACKFILL_ADAPTIVE": "off",
        "BACKFILL_FLUSH_MS": str(FLUSH_MS),
        "BACKFILL_PG_DEAD_PEER_SECONDS": str(DEAD_PEER_S),
    }


def run_drill(
    c: Cluster, sim: Simulator, stop: Callable[[str, subprocess.Popen[bytes]], object]
) -> Outcome:
    """``bin/prod`` and the workers started, the posts imported, a backfill launched through
    GraphQL; ``stop(name, worker)`` once each worker runs a labels step and the first has sent a
    third of its posts; until the backfill completes. Every process is stopped on return."""
    figures: dict[str, Any] = {}
    t0 = time.monotonic()
    prod = start_session([str(PROD)], c.env, ROOT, c.logs / "prod.log")
    workers: dict[str, subprocess.Popen[bytes]] = {}
    launched: subprocess.Popen[str] | None = None
    try:
        records = [
            {"tenant_id": t, "post_id": f"{t}-{i}", "text": f"post {i} of {t}"}
            for t, n in POSTS.items()
            for i in range(n)
        ]
        export = write_jsonl(c.logs / "posts.jsonl", records)
        # The workers once bin/prod's preflight has created the instance's schema.
        wait_ready(c.base_url, prod, c.logs / "prod.log", timeout=120)
        for name, (prefix, env) in c.workers.items():
            argv = [*prefix, str(PROD), "worker", "--concurrency", "1"]
            workers[name] = start_session(argv, env, ROOT, c.logs / f"{name}.log")
        # bin/prod names each worker backfill-<its pid>@<host> (`ip netns exec` keeps the pid).
        node_of = {name: f"backfill-{proc.pid}@" for name, proc in workers.items()}
        cli = [sys.executable, "-m", "backfill_assets.cli"]
        imported = subprocess.run(
            [*cli, "import", str(export), "--json"], env=c.env, cwd=ROOT, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert imported.returncode == 0, imported.stderr[-2000:]
        figures["ready_s"] = round(time.monotonic() - t0, 1)
        launched = subprocess.Popen(
            [*cli, "launch", "--missing", "--json", "--wait", str(WAIT_SECONDS), "--url",
             c.base_url],
            env=c.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        victim, tenant = _stop_one_worker_mid_step(workers, node_of, c, stop, figures)
        out, err = launched.communicate(timeout=WAIT_SECONDS + 60)
        figures["stop_to_done_s"] = round(time.monotonic() - figures.pop("stopped_at"), 1)
        logs = "\n".join((c.logs / f"{n}.log").read_text()[-2000:] for n in ("prod", *workers))
        assert launched.returncode == 0, f"{err[-3000:]}\n{logs}"
        doc = json.loads(out)
        assert {b["status"] for b in doc["backfills"]} == {"COMPLETED_SUCCESS"}, doc
        figures["launch_to_done_s"] = round(time.monotonic() - t0 - figures["ready_s"], 1)
        steps = _step_workers(c.home)
        # The broker's password is not in the workers' logs.
        assert all(":guest@" not in (c.logs / f"{n}.log").read_text() for n in workers)
        assert all("guest:***@" in (c.logs / f"{n}.log").read_text() for n in workers)
    finally:
        if launched is not None and launched.poll() is None:
            launched.kill()
        kill_sessions([prod, *workers.values()])
        sim.stop()
    return Outcome(victim, tenant, node_of, steps, sim.meter.snapshot(), figures)


def check_outcome(c: Cluster, found: Outcome, label: str) -> None:
    """Both workers ran steps, the stopped step was taken by the other worker, the backfill
    is complete and applied once, and the ledger is the meter but for the calls in flight.
    Prints the figures (pytest -s)."""
    node_of, steps, tenant = found.node_of, found.steps, found.tenant
    survivor = next(n for n in node_of if n != found.victim)
    nodes = {w for _t, _s, w, _at in steps}
    # Every step ran on a worker, and both workers ran steps.
    assert all(any(w.startswith(node_of[n]) for n in node_of) for w in nodes), nodes
    assert all(any(w.startswith(node_of[n]) for w in nodes) for n in node_of), (nodes, node_of)
    # The stopped step was taken again, by the survivor.
    taken = [(w, at) for t, s, w, at in steps if t == tenant and s == "moderation_labels"]
    assert len(taken) == 2 and taken[0][0].startswith(node_of[found.victim]), taken
    assert taken[1][0].startswith(node_of[survivor]), taken
    # The survivor runs one step at a time: it takes the step once its own labels step ends.
    found.figures["taken_again_after_s"] = round(taken[1][1] - found.figures.pop("stopped_wall"), 1)

    verified = subprocess.run(
        [sys.executable, "-m", "backfill_assets.cli", "verify", "--require-complete", "--json"],
        env=c.env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    report = last_json(verified.stdout)
    assert verified.returncode == 0 and report["ok"], report.get("problems")
    done = _pairs(c.store_url, "SELECT tenant_id, count(*) FROM results GROUP BY tenant_id")
    assert done == POSTS
    # Applied once per partition: one applied_labels materialisation each.
    with dg.DagsterInstance.from_config(str(c.home)) as instance:
        applied = instance.fetch_materializations(dg.AssetKey("applied_labels"), limit=100)
        partitions = [str(r.partition_key) for r in applied.records]
    assert sorted(partitions) == sorted(set(partitions)) and len(partitions) == len(POSTS)

    booked = _pairs(
        c.store_url,
        "SELECT tenant_id, sum(tokens_in + tokens_out) FROM ledger_events"
        " WHERE type = 'usage' GROUP BY tenant_id",
    )
    bills = found.meter.billed_by_correlation_id
    billed, repaid, unbooked = {}, {}, {}
    for t in POSTS:
        with engine_for(c.store_url).connect() as conn:
            keys = conn.execute(
                sa.text("SELECT DISTINCT key FROM ledger_events WHERE tenant_id = :t"), {"t": t}
            ).scalars()
            mine = [bills[k] for k in keys if k in bills]
        billed[t] = sum(b.total_tokens for b in mine)
        repaid[t] = sum(b.requests - 1 for b in mine)
        unbooked[t] = billed[t] - booked[t]
    other = next(t for t in POSTS if t != tenant)
    figures = found.figures
    figures.update(
        victim=found.victim,
        steps_by_worker={
            n: sum(w.startswith(node_of[n]) for _t, _s, w, _at in steps) for n in node_of
        },
        billed_tokens=billed,
        booked_tokens=booked,
        repaid_calls=repaid,
        orphan_attempts={t["tenant"]: t["orphan_attempts"] for t in report["tenants"]},
        in_flight_bound=IN_FLIGHT_BOUND,
        meter_requests=found.meter.requests_total,
    )
    print(f"\n{label}: " + json.dumps(figures))  # the drill's figures (pytest -s)
    # Every billed token is booked once, except the calls in flight when the worker stopped.
    assert sum(billed.values()) == found.meter.billed_tokens_total
    assert booked[other] == billed[other] and repaid[other] == 0
    assert unbooked[tenant] >= 0 and repaid[tenant] <= IN_FLIGHT_BOUND
    assert figures["orphan_attempts"][tenant] <= IN_FLIGHT_BOUND


def test_steps_on_two_celery_workers_one_killed_mid_step(
    pg_pair: tuple[str, str], vhost: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    instance_url, store_url = pg_pair
    home, port = tmp_path / "home", _free_port()
    sim = Simulator(SimConfig(latency_median_ms=LATENCY_MS)).start()
    broker = f"pyamqp://guest:guest@{BROKER[0]}:{BROKER[1]}/{vhost}"
    env = celery_env(prod_env(instance_url, store_url, home, port), broker, sim.base_url)
    # The event log, read here, is the instance's.
    clear_settings(monkeypatch)
    monkeypatch.setenv("DAGSTER_PG_URL", instance_url)
    c = Cluster(
        env, {"w1": ([], env), "w2": ([], env)}, home, store_url, f"http://127.0.0.1:{port}",
        tmp_path,
    )  # fmt: skip
    # SIGKILL of the worker's whole tree: the host gone, its connections closed.
    found = run_drill(c, sim, lambda _name, proc: kill_session(proc.pid))
    check_outcome(c, found, "celery workers")


def _stop_one_worker_mid_step(
    workers: dict[str, subprocess.Popen[bytes]],
    node_of: dict[str, str],
    c: Cluster,
    stop: Callable[[str, subprocess.Popen[bytes]], object],
    figures: dict[str, Any],
) -> tuple[str, str]:
    """Once each worker runs one tenant's labels step and the first has sent a third of its
    posts, ``stop`` that worker; the worker and its tenant."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        for name, proc in workers.items():
            assert proc.poll() is None, f"worker {name} exited before the stop"
        steps = _step_workers(c.home)
        labels = {w: t for t, s, w, _at in steps if s == "moderation_labels"}
        on = {n: t for n in workers for w, t in labels.items() if w.startswith(node_of[n])}
        if len(on) == 2:
            victim = min(on)
            tenant = on[victim]
            sql = "SELECT count(*) FROM results WHERE tenant_id = :t"
            sent = int(_scalar(c.store_url, sql, t=tenant))
            if sent >= POSTS[tenant] // 3:
                assert sent < POSTS[tenant], "the step ended before the stop"
                stop(victim, workers[victim])
                figures["stopped_at"] = time.monotonic()
                figures["stopped_wall"] = time.time()
                figures["stopped_at_results"] = sent
                return victim, tenant
        time.sleep(0.2)
    raise AssertionError("the two workers never ran a labels step each")


def test_prod_worker_refuses_without_the_celery_executor(tmp_path: Path) -> None:
    env = prod_env("postgresql+psycopg2://h/d", "postgresql://h/s", tmp_path, 3000)
    env["BACKFILL_CELERY_BROKER_URL"] = "pyamqp://guest:s3cr3t@rabbit:5672//"
    done = subprocess.run(
        [str(PROD), "worker"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert "BACKFILL_EXECUTOR=celery" in done.stderr
    assert "s3cr3t" not in done.stderr


def test_prod_worker_starts_after_the_preflight_and_stops_on_sigterm(
    pg_pair: tuple[str, str], vhost: str, tmp_path: Path
) -> None:
    instance_url, store_url = pg_pair
    broker = f"pyamqp://guest:guest@{BROKER[0]}:{BROKER[1]}/{vhost}"
    env = celery_env(
        prod_env(instance_url, store_url, tmp_path / "home", 3000), broker, "http://127.0.0.1:9/v1"
    )
    log = tmp_path / "worker.log"
    proc = start_session([str(PROD), "worker", "--concurrency", "1"], env, ROOT, log)
    try:
        deadline = time.monotonic() + 90
        while " ready." not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        text = log.read_text()
        assert "[prod] store:" in text and "[prod] broker: pyamqp://guest:***@" in text
        assert f"backfill-{proc.pid}@" in text  # one name per worker
        # bin/prod, Celery's main process and its pool process.
        assert len(session_pids(proc.pid)) >= 3
        code, took = stop(proc, signal.SIGTERM, timeout=40)
        assert code == 143, log.read_text()[-3000:]
        assert session_pids(proc.pid) == [], "processes left behind by bin/prod worker"
        assert took < 20
    finally:
        kill_sessions([proc])
