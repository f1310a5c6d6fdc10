"""Batch mode through the real CLI and Dagster: BACKFILL_DISPATCH=batch is all it takes."""

from __future__ import annotations

from pathlib import Path

from backfill_assets.ledger.engines import engine_for
from backfill_tests.cli_runs import clean_env, last_json, run_cli
from backfill_tests.conftest import write_jsonl
from backfill_tests.dispatch.batch.conftest import API_KEY, StartSim, records, rows

POSTS = 24


def test_cli_run_in_batch_mode_materialises_checks_and_applies(
    tmp_path: Path, start_sim: StartSim
) -> None:
    sim = start_sim()
    url = f"sqlite:///{tmp_path / 'store.db'}"
    env = clean_env(
        DAGSTER_HOME=str(tmp_path / "dagster_home"),
        BACKFILL_DATABASE_URL=url,
        BACKFILL_MODEL_BACKEND="openai",
        BACKFILL_MODEL_BASE_URL=sim.base_url,
        BACKFILL_MODEL_API_KEY=API_KEY,
        BACKFILL_DISPATCH="batch",
        BACKFILL_BATCH_POLL_SECONDS="0.01",
    )
    data = records(["acme"], POSTS)
    imported = run_cli(["import", str(write_jsonl(tmp_path / "posts.jsonl", data))], env)
    assert imported.returncode == 0, imported.stderr[-2000:]

    run = run_cli(["run", "--json"], env)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = last_json(run.stdout)
    assert doc["ok"] and doc["totals"]["model_calls"] == POSTS
    assert doc["totals"]["accepted"] == POSTS
    assert {c["passed"] for p in doc["partitions"] for c in p["checks"]} == {True}
    # Every partition the run held was applied (a small tenant's posts fill few partitions).
    applied = {p["partition"] for p in doc["partitions"] if p["applied"]}
    assert applied and applied == {p["partition"] for p in doc["partitions"]}
    assert "batch" in run.stderr and "completed" in run.stderr  # progress in the run log

    meter = sim.meter.snapshot()
    assert meter.responses_by_status == {}  # not one synchronous call
    assert len(meter.billed) == POSTS and set(meter.batch_creates_by_chunk.values()) == {1}
    engine = engine_for(url)
    assert {r.state for r in rows(engine, "SELECT state FROM batch_submissions")} == {"booked"}

    verify = run_cli(["verify", "--require-complete", "--json"], env)
    report = last_json(verify.stdout)
    assert verify.returncode == 0 and report["ok"], report["problems"]
    assert report["tenants"][0]["rebilled_tokens"] == 0
    captured = imported.stderr + run.stdout + run.stderr + verify.stdout
    assert API_KEY not in captured
    assert not [r["text"] for r in data if r["text"] in captured]


def test_a_wrong_key_fails_the_dagster_run_and_a_good_key_completes_it(
    tmp_path: Path, start_sim: StartSim
) -> None:
    sim = start_sim()
    url = f"sqlite:///{tmp_path / 'store.db'}"
    wrong = "sk-wrong-batch-key-1234567890abcdef"
    env = clean_env(
        DAGSTER_HOME=str(tmp_path / "dagster_home"),
        BACKFILL_DATABASE_URL=url,
        BACKFILL_MODEL_BACKEND="openai",
        BACKFILL_MODEL_BASE_URL=sim.base_url,
        BACKFILL_MODEL_API_KEY=wrong,
        BACKFILL_DISPATCH="batch",
        BACKFILL_BATCH_POLL_SECONDS="0.01",
    )
    data = records(["acme"], 8)
    assert (
        run_cli(["import", str(write_jsonl(tmp_path / "posts.jsonl", data))], env).returncode == 0
    )

    refused = run_cli(["run", "--tenant", "acme", "--json"], env)
    assert refused.returncode == 1
    said = refused.stdout + refused.stderr
    assert "HTTP 401" in said and "/files" in said and wrong not in said
    engine = engine_for(url)
    # Nothing closed, nothing dead-lettered: every chunk waits for a run with the right key.
    assert {r.state for r in rows(engine, "SELECT state FROM batch_submissions")} == {"intent"}
    assert rows(engine, "SELECT * FROM dead_letters") == []

    fixed = run_cli(
        ["run", "--tenant", "acme", "--json"], {**env, "BACKFILL_MODEL_API_KEY": API_KEY}
    )
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert {r.state for r in rows(engine, "SELECT state FROM batch_submissions")} == {"booked"}
    assert len(sim.meter.snapshot().billed) == len(data)
