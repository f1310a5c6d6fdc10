"""Crash drill over HTTP: the real CLI against the simulator, SIGKILLed mid-run, then resumed."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import sqlalchemy as sa

from backfill_assets.demo.generate import demo_posts, write_export
from backfill_assets.ledger.engines import engine_for
from backfill_assets.providersim.billing.meter import MeterSnapshot
from backfill_assets.providersim.runner import Simulator
from backfill_tests.cli_runs import clean_env, last_json, run_cli
from backfill_tests.providers.conftest import API_KEY, StartSim

CONCURRENCY = 8
POSTS = 160
KILL_AFTER = 60


def _settled(sim: Simulator, quiet_s: float = 0.5, timeout_s: float = 15.0) -> MeterSnapshot:
    """The meter once the killed run's last calls are answered. The simulator, like a
    provider, bills a call when it has answered it, even if the client is gone: a snapshot
    taken right after the kill can miss calls in flight that are billed a moment later."""
    last = sim.meter.snapshot()
    quiet_since = deadline = time.monotonic()
    deadline += timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = sim.meter.snapshot()
        if (len(now.billed), now.requests_total) != (len(last.billed), last.requests_total):
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return now
    raise AssertionError(f"the simulator was still answering after {timeout_s} s")


def test_sigkill_mid_run_over_http_then_resume(tmp_path: Path, start_sim: StartSim) -> None:
    sim = start_sim(api_key=API_KEY, latency_median_ms=40, latency_sigma=0.3, seed=3)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    env = clean_env(
        DAGSTER_HOME=str(tmp_path / "dagster_home"),
        BACKFILL_DATABASE_URL=url,
        BACKFILL_CONCURRENCY=str(CONCURRENCY),
        BACKFILL_MODEL_BACKEND="openai",
        BACKFILL_MODEL_BASE_URL=sim.base_url,
        BACKFILL_MODEL_API_KEY=API_KEY,
        BACKFILL_RPM="6000",
    )
    # One tenant: the CLI runs one Dagster run per tenant, and each costs ~10 s here.
    tenants = ["acme"]
    write_export(tmp_path / "posts.jsonl", tenants, POSTS, bad_lines=True)
    outputs = [run_cli(["import", str(tmp_path / "posts.jsonl")], env)]
    assert outputs[-1].returncode == 0, outputs[-1].stderr[-2000:]

    outputs.append(
        run_cli(["run", "--json"], {**env, "BACKFILL_KILL_AFTER_USAGE": str(KILL_AFTER)})
    )
    assert outputs[-1].returncode == -signal.SIGKILL, outputs[-1].stderr[-2000:]
    engine = engine_for(url)
    with engine.connect() as conn:
        booked = set(
            conn.execute(
                sa.text("SELECT request_id FROM ledger_events WHERE type = 'usage'")
            ).scalars()
        )
        # Announced attempts with no usage or error: the calls in flight when the kill came.
        in_flight = conn.execute(
            sa.text(
                "SELECT count(*) FROM ledger_events a WHERE a.type = 'attempt' AND NOT EXISTS"
                " (SELECT 1 FROM ledger_events e WHERE e.attempt_id = a.attempt_id"
                " AND e.type <> 'attempt')"
            )
        ).scalar_one()
    killed = _settled(sim)
    assert KILL_AFTER <= len(booked) < POSTS
    # Paid by the provider but never made durable: the only re-spend window.
    lost = set(killed.billed) - booked
    assert booked <= set(killed.billed)
    assert len(lost) <= in_flight <= 2 * CONCURRENCY

    outputs.append(run_cli(["run", "--json"], env))
    assert outputs[-1].returncode == 0, outputs[-1].stderr[-3000:]
    outputs.append(run_cli(["verify", "--require-complete", "--json"], env))
    doc = last_json(outputs[-1].stdout)
    assert doc["ok"], doc["problems"]

    final = sim.meter.snapshot()
    per_key = Counter(call.correlation_id for call in final.billed.values())
    rebilled = {key for key, n in per_key.items() if n > 1}
    # Exactly the lost calls were paid again, each once: at most the calls in flight.
    assert rebilled == {killed.billed[r].correlation_id for r in lost}
    assert max(per_key.values()) <= 2
    rebilled_tokens = sum(killed.billed[r].total_tokens for r in lost)
    max_call = max(call.total_tokens for call in final.billed.values())
    assert rebilled_tokens <= in_flight * max_call
    with engine.connect() as conn:
        usage = conn.execute(
            sa.text(
                "SELECT count(*), sum(tokens_in + tokens_out) FROM ledger_events"
                " WHERE type = 'usage'"
            )
        ).one()
        results = conn.execute(sa.text("SELECT count(*) FROM results")).scalar_one()
    assert results == POSTS
    # The ledger is the meter minus the lost calls, to the token.
    assert usage[0] == len(final.billed) - len(lost)
    assert usage[1] == final.billed_tokens_total - rebilled_tokens
    assert sum(t["rebilled_tokens"] for t in doc["tenants"]) == 0

    texts = [p["text"] for p in demo_posts(tenants, POSTS)]
    captured = "\n".join(o.stdout + o.stderr for o in outputs)
    assert API_KEY not in captured
    assert not [t for t in texts if t in captured]
    for path in (tmp_path / "dagster_home").rglob("*"):
        if path.is_file():
            assert API_KEY.encode() not in path.read_bytes(), path
    print(
        f"http crash drill: booked before kill={len(booked)}, in flight={in_flight},"
        f" paid but lost={len(lost)}, rebilled tokens={rebilled_tokens}"
    )
