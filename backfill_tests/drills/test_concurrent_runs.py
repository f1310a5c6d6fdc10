"""Two ``backfill-moderation run`` processes started at once on overlapping partitions.

The posts are loaded straight into the store, so both runs also race to create the Dagster
instance (a fresh ``DAGSTER_HOME``) and to register the same tenants as dynamic partitions.
Whatever the interleaving: every key is done exactly once and billed once by the simulator,
and each run exits 0, or 1 with the documented "being written by another run" message when it
found a partition locked by the other; never a traceback of its own.
"""

from __future__ import annotations

import multiprocessing as mp
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from backfill_assets.ledger.engines import engine_for
from backfill_tests.cli_runs import clean_env, last_json
from backfill_tests.conftest import StartSim, import_records

TENANTS = ("acme", "globex", "initech")
PER_TENANT = 30
BUSY = "being written by another run"
RACERS = 4


def _records() -> list[dict[str, Any]]:
    return [
        {"tenant_id": t, "post_id": f"p{i}", "text": f"{t} post {i}: arrived on time"}
        for t in TENANTS
        for i in range(PER_TENANT)
    ]


def _start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "backfill_assets.cli", "run", "--json", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_runs_at_once_on_overlapping_partitions(
    store_url: str, tmp_path: Path, start_sim: StartSim
) -> None:
    sim = start_sim(latency_median_ms=20, latency_sigma=0.2, seed=4)
    engine = engine_for(store_url)
    import_records(engine, tmp_path, _records())
    env = clean_env(
        DAGSTER_HOME=str(tmp_path / "dagster_home"),
        BACKFILL_DATABASE_URL=store_url,
        BACKFILL_MODEL_BACKEND="openai",
        BACKFILL_MODEL_BASE_URL=sim.base_url,
        BACKFILL_CONCURRENCY="4",
    )
    # Every tenant, and two of them again: globex and initech are wanted by both runs.
    procs = [_start(env), _start(env, "--tenant", "globex", "--tenant", "initech")]
    outs = [p.communicate(timeout=180) for p in procs]
    for proc, (stdout, stderr) in zip(procs, outs, strict=True):
        assert proc.returncode in (0, 1), stderr[-3000:]
        assert "Traceback" not in stderr, stderr[-3000:]
        doc = last_json(stdout)
        if proc.returncode == 1:
            # The only accepted failure: a partition the other run was writing.
            failed = [r for r in doc["runs"] if not r["success"]]
            assert failed and all(BUSY in (r["error"] or "") for r in failed), (
                doc["runs"],
                stderr[-3000:],
            )

    meter = sim.meter.snapshot()
    per_key = Counter(call.correlation_id for call in meter.billed.values())
    with engine.connect() as conn:
        results = conn.execute(sa.text("SELECT key, tenant_id FROM results")).all()
    assert len(results) == len(TENANTS) * PER_TENANT
    assert set(per_key) == {key for key, _ in results}
    assert set(per_key.values()) == {1}, "a key was billed twice"

    out = subprocess.run(
        [sys.executable, "-m", "backfill_assets.cli", "verify", "--require-complete", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = last_json(out.stdout)
    assert out.returncode == 0 and doc["ok"], doc["problems"]


def _racer(home: str, tenant: str, barrier: Any, results: Any) -> None:
    """Create the instance and register ``tenant`` the moment every racer is ready."""
    from backfill_assets.config.settings import Settings
    from backfill_assets.defs.partitions import ensure_partitions
    from backfill_assets.runner.instance import instance

    barrier.wait()
    try:
        ensure_partitions(instance(Settings.from_env({"DAGSTER_HOME": home})), {tenant: 0})
        results.put("ok")
    except Exception as exc:  # reported to the test, which prints it
        results.put(f"{type(exc).__name__}: {str(exc)[:300]}")


def test_racing_processes_create_one_instance_and_register_a_tenant_once(tmp_path: Path) -> None:
    # What the two CLI runs above race on, without the seconds of import that blur the race:
    # before the fixes this failed with "table runs already exists", two alembic heads, or a
    # unique-constraint error on dynamic_partitions.
    from backfill_assets.config.settings import Settings
    from backfill_assets.runner.instance import instance

    ctx = mp.get_context("fork")  # the racers start at once, without re-importing Dagster
    home = str(tmp_path / "dagster_home")
    for tenant in ("acme", "globex"):  # a fresh home, then an existing one
        barrier, results = ctx.Barrier(RACERS), ctx.Queue()
        procs = [
            ctx.Process(target=_racer, args=(home, tenant, barrier, results)) for _ in range(RACERS)
        ]
        for proc in procs:
            proc.start()
        outcomes = [results.get(timeout=180) for _ in procs]
        for proc in procs:
            proc.join(30)
        assert outcomes == ["ok"] * RACERS, outcomes
    inst = instance(Settings.from_env({"DAGSTER_HOME": home}))
    assert inst.get_dynamic_partitions("tenant_slices") == ["s00|acme", "s00|globex"]
