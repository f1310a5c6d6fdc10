"""Crash drills: the real CLI in a subprocess, SIGKILLed from inside and from outside."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from backfill_assets.demo.generate import write_export
from backfill_tests.cli_runs import clean_env, last_json, run_cli
from backfill_tests.pipeline_helpers import count

CONCURRENCY = 8
TOTAL = 500
FLUSH_ROWS = 2048  # writer default: the most a single flush can hold


@pytest.fixture
def drill_env(store_url: str, tmp_path: Path) -> dict[str, str]:
    env = clean_env(
        DAGSTER_HOME=str(tmp_path / "dagster_home"),
        BACKFILL_DATABASE_URL=store_url,
        BACKFILL_CONCURRENCY=str(CONCURRENCY),
    )
    # One tenant: one Dagster run per CLI call keeps the drill fast; its 16 partitions still
    # share one dispatcher, so a kill lands mid-partition.
    export = write_export(tmp_path / "posts.jsonl", ["acme"], TOTAL, bad_lines=False)
    assert export == TOTAL
    out = run_cli(["import", "--json", str(tmp_path / "posts.jsonl")], env)
    assert out.returncode == 0, out.stderr
    assert last_json(out.stdout)["imported"] == TOTAL
    return env


def run_json(env: dict[str, str]) -> dict[str, Any]:
    out = run_cli(["run", "--json"], env)
    assert out.returncode == 0, out.stderr[-3000:]
    doc: dict[str, Any] = last_json(out.stdout)
    return doc


def verify_json(env: dict[str, str]) -> dict[str, Any]:
    out = run_cli(["verify", "--require-complete", "--json"], env)
    doc: dict[str, Any] = last_json(out.stdout)
    assert out.returncode == (0 if doc["ok"] else 1)
    return doc


def assert_resumed_cleanly(
    engine: Engine, env: dict[str, str], calls_before: int, done_before: int
) -> None:
    second = run_json(env)
    calls_resume = second["totals"]["model_calls"]
    # Only unfinished keys are sent again.
    assert calls_resume == TOTAL - done_before
    doc = verify_json(env)
    assert doc["ok"], doc["problems"]
    assert count(engine, "SELECT count(*) FROM results") == TOTAL
    rebilled = sum(t["rebilled_tokens"] for t in doc["tenants"])
    orphans = sum(t["orphan_attempts"] for t in doc["tenants"])
    max_call_tokens = count(
        engine, "SELECT max(tokens_in + tokens_out) FROM ledger_events WHERE type = 'usage'"
    )
    # A usage event and its result commit in one transaction, so the ledger never shows a key
    # paid twice; what a crash can lose is the calls in flight plus one flush, visible as orphans.
    assert rebilled <= CONCURRENCY * max_call_tokens
    assert orphans <= CONCURRENCY + FLUSH_ROWS
    third = run_json(env)
    assert third["totals"]["model_calls"] == 0
    print(
        f"crash drill: calls before kill={calls_before}, results before resume={done_before}, "
        f"calls on resume={calls_resume}, rebilled tokens={rebilled}, orphan attempts={orphans}"
    )


def test_kill_after_usage_then_resume(engine: Engine, drill_env: dict[str, str]) -> None:
    # Short flushes: the kill lands after the flush that crosses 150, well before the end.
    env = {
        **drill_env,
        "BACKFILL_KILL_AFTER_USAGE": "150",
        "BACKFILL_FAKE_LATENCY_MS": "5",
        "BACKFILL_FLUSH_MS": "10",
    }
    first = run_cli(["run", "--json"], env)
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    usage = count(engine, "SELECT count(*) FROM ledger_events WHERE type = 'usage'")
    done = count(engine, "SELECT count(*) FROM results")
    assert 150 <= usage < TOTAL and done == usage
    calls_before = count(engine, "SELECT count(*) FROM ledger_events WHERE type = 'attempt'")
    assert_resumed_cleanly(engine, drill_env, calls_before, done)


def test_external_sigkill_at_a_random_moment_then_resume(
    engine: Engine, drill_env: dict[str, str]
) -> None:
    env = {**drill_env, "BACKFILL_FAKE_LATENCY_MS": "15"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "backfill_assets.cli", "run", "--json"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while count(engine, "SELECT count(*) FROM ledger_events WHERE type = 'usage'") < 20:
            assert proc.poll() is None, "run finished before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(random.uniform(0.0, 0.4))
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    done = count(engine, "SELECT count(*) FROM results")
    assert done < TOTAL
    calls_before = count(engine, "SELECT count(*) FROM ledger_events WHERE type = 'attempt'")
    assert_resumed_cleanly(engine, drill_env, calls_before, done)
