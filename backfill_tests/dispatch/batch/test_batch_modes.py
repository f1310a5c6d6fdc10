"""Sync and batch mode over the same partitions while a batch is open at the provider:
no key is paid twice across modes, and an open batch's reservation holds after its process died.

A batch-mode run (the real CLI in a subprocess) is SIGKILLed while its batches are open
(``BACKFILL_KILL_AT=poll``), a sync run goes over the same partitions, and a batch-mode run
re-attaches and completes.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from backfill_assets.config.variables import RunSettings
from backfill_assets.defs.partitions import partition_key_for
from backfill_assets.dispatch.pipeline import (
    PartitionRef,
    PartitionReport,
    RunOptions,
    run_partitions,
)
from backfill_assets.domain.policy.rubric import call_token_bound
from backfill_assets.domain.work.keys import SLICE_COUNT
from backfill_assets.ledger.engines import engine_for
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.providers.ratelimit import LimiterConfig, LimiterRegistry
from backfill_assets.runner.verify import verify_store
from backfill_tests.cli_runs import clean_env
from backfill_tests.conftest import import_records
from backfill_tests.dispatch.batch.conftest import (
    API_KEY,
    MODEL,
    RETRY,
    RUBRIC,
    VERSIONS,
    StartSim,
    batch_options,
    key_of,
    records,
    rows,
)
from backfill_tests.pipeline_helpers import refs_for


def _env(url: str, base_url: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = clean_env(
        DAGSTER_HOME=str(tmp_path / "dagster_home"),
        BACKFILL_DATABASE_URL=url,
        BACKFILL_MODEL_BACKEND="openai",
        BACKFILL_MODEL_BASE_URL=base_url,
        BACKFILL_MODEL_API_KEY=API_KEY,
        BACKFILL_BATCH_POLL_SECONDS="0.01",
        BACKFILL_BATCH_MAX_LINES="4",
        **extra,
    )
    return env


def _batch_run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "backfill_assets.cli.batch_run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _sync_run(engine: sa.Engine, base_url: str, budget: int | None = None) -> list[PartitionReport]:
    limiter = LimiterRegistry().get("sync", LimiterConfig())
    return run_partitions(
        engine,
        refs_for(["acme"]),
        lambda: OpenAIHttpModel(base_url=base_url, model=MODEL, api_key=API_KEY, limiter=limiter),
        VERSIONS,
        RUBRIC,
        "sync-run",
        RunOptions(run=RunSettings(concurrency=16, tenant_budget_tokens=budget or 0), retry=RETRY),
    )


def _extra(n: int) -> list[dict[str, str]]:
    return [{**r, "post_id": f"{r['post_id']}-later"} for r in records(["acme"], n)]


def _billed_once(meter: Any, keys: set[str]) -> None:
    per_key = Counter(c.correlation_id for c in meter.billed.values())
    assert set(per_key) == keys and set(per_key.values()) == {1}, per_key.most_common(3)


def test_a_sync_run_leaves_keys_in_an_open_batch_to_the_batch(
    tmp_path: Path, start_sim: StartSim
) -> None:
    sim = start_sim(batch_processing_ms=1500, seed=8)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = engine_for(url)
    data = records(["acme"], 24)
    import_records(engine, tmp_path, data)
    env = _env(url, sim.base_url, tmp_path)
    killed = _batch_run({**env, "BACKFILL_KILL_AT": "poll"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    in_batch = {r.key for r in rows(engine, "SELECT key FROM batch_lines")}
    assert in_batch == {key_of(r) for r in data}
    later = _extra(6)
    import_records(engine, tmp_path, later, "later.jsonl")

    reports = _sync_run(engine, sim.base_url)
    sync_paid = {c.correlation_id for c in sim.meter.snapshot().billed.values() if not c.batch_id}
    assert sync_paid == {key_of(r) for r in later}
    # Reported, so coverage is explained: these keys wait for their batch.
    assert sum(r.in_open_batch for r in reports) == len(in_batch)
    assert sum(r.pending for r in reports) == len(later)

    resumed = _batch_run(env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _billed_once(sim.meter.snapshot(), {key_of(r) for r in data + later})
    doc = verify_store(engine, VERSIONS).as_dict(require_complete=True)
    assert doc["ok"], doc["problems"]
    assert doc["tenants"][0]["rebilled_tokens"] == 0


def test_an_open_batch_keeps_its_reservation_after_its_process_died(
    tmp_path: Path, start_sim: StartSim
) -> None:
    sim = start_sim(batch_processing_ms=1500, seed=8)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = engine_for(url)
    data = records(["acme"], 24)
    import_records(engine, tmp_path, data)
    later = _extra(200)
    bounds = sum(call_token_bound(RUBRIC, key_of(r), r["text"]) for r in data)
    # Room for the open batches' bounds and two sync calls more: no more.
    cap = bounds + 2 * max(call_token_bound(RUBRIC, key_of(r), r["text"]) for r in later)
    env = _env(url, sim.base_url, tmp_path, BACKFILL_TENANT_BUDGET_TOKENS=str(cap))
    killed = _batch_run({**env, "BACKFILL_KILL_AT": "poll"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    [(held,)] = rows(engine, "SELECT sum(reserved_tokens) FROM batch_submissions")
    # An hour passes without a heartbeat from anyone (a paused or dead process).
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE budget_reservations SET heartbeat_at = '2000-01-01'"))
    import_records(engine, tmp_path, later, "later.jsonl")

    reports = _sync_run(engine, sim.base_url, budget=cap)
    assert sum(r.stats.outcomes["deferred"] for r in reports) > 0  # the cap binds
    resumed = _batch_run(env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    meter = sim.meter.snapshot()
    assert meter.billed_tokens_total <= cap
    [(tenant_billed,)] = rows(engine, "SELECT billed_tokens FROM tenants")
    assert tenant_billed == meter.billed_tokens_total
    assert held == bounds  # the open chunks held their lines' bounds, in their own rows
    assert rows(engine, "SELECT * FROM budget_reservations WHERE tokens <> 0") == []
    assert rows(engine, "SELECT * FROM batch_submissions WHERE reserved_tokens <> 0") == []
    paid = {c.correlation_id for c in meter.billed.values()}
    assert {key_of(r) for r in data} <= paid
    _billed_once(meter, paid)


def test_a_wrong_key_stops_the_batch_run_and_leaves_every_chunk_open(
    tmp_path: Path, start_sim: StartSim
) -> None:
    sim = start_sim()
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = engine_for(url)
    data = records(["acme"], 12)
    import_records(engine, tmp_path, data)
    wrong = "sk-wrong-batch-key-1234567890abcdef"
    env = _env(url, sim.base_url, tmp_path)

    refused = _batch_run({**env, "BACKFILL_MODEL_API_KEY": wrong})
    assert refused.returncode == 1, refused.stderr[-2000:]
    assert "HTTP 401" in refused.stderr and "POST" in refused.stderr and "/files" in refused.stderr
    assert wrong not in refused.stdout + refused.stderr
    meter = sim.meter.snapshot()
    assert meter.files_uploaded == 0 and meter.batch_creates_total == 0
    # Left as they were: no chunk failed or abandoned, no key dead-lettered or attempted twice.
    assert {r.state for r in rows(engine, "SELECT state FROM batch_submissions")} == {"intent"}
    assert rows(engine, "SELECT * FROM dead_letters") == []
    assert rows(engine, "SELECT * FROM ledger_events WHERE type <> 'attempt'") == []

    resumed = _batch_run(env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert {r.state for r in rows(engine, "SELECT state FROM batch_submissions")} == {"booked"}
    assert {r.attempt_no for r in rows(engine, "SELECT attempt_no FROM batch_lines")} == {1}
    _billed_once(sim.meter.snapshot(), {key_of(r) for r in data})


@pytest.mark.timeout(120)
def test_a_partition_of_several_stored_slices_is_booked_once_per_key(
    tmp_path: Path, start_sim: StartSim
) -> None:
    # A small tenant's partitions hold several stored slices (slice levels): level 1 puts the
    # even slices into s00 and the odd ones into s01. Rows must carry each post's own slice.
    sim = start_sim()
    engine = engine_for(f"sqlite:///{tmp_path / 'store.db'}")
    data = records(["acme"], 20)
    import_records(engine, tmp_path, data)
    refs = [
        PartitionRef(partition_key_for("acme", f"s{p:02d}"), "acme", p, level=1) for p in (0, 1)
    ]
    run_partitions(
        engine,
        refs,
        lambda: pytest.fail("batch mode must not build the sync adapter"),
        VERSIONS,
        RUBRIC,
        "levels",
        batch_options(sim, max_lines=50),
    )
    _billed_once(sim.meter.snapshot(), {key_of(r) for r in data})
    subs = rows(engine, "SELECT slice, state FROM batch_submissions")
    assert {s.state for s in subs} == {"booked"} and {s.slice for s in subs} < set(
        range(SLICE_COUNT)
    )
    doc = verify_store(engine, VERSIONS).as_dict(require_complete=True)
    assert doc["ok"], doc["problems"]
    assert doc["tenants"][0]["done"] == len(data)
