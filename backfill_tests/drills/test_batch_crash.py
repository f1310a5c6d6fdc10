"""Crash drills: a batch-mode run SIGKILLed at each step, then resumed.

The run is the real entry point (``python -m backfill_assets.cli.batch_run``: the same
``run_partitions``, writer locks, ledger and submission ledger as a Dagster run) in a
subprocess, killed from inside with ``BACKFILL_KILL_AT``. The simulator lives in this process
and survives the kill, like a real provider. After the resume: no chunk was created twice, no
line billed twice, every key is done and ``verify --require-complete`` passes.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from backfill_assets.ledger.engines import engine_for
from backfill_assets.runner.verify import verify_store
from backfill_tests.cli_runs import clean_env, last_json
from backfill_tests.conftest import import_records
from backfill_tests.dispatch.batch.conftest import (
    API_KEY,
    RUBRIC,
    VERSIONS,
    StartSim,
    records,
    rows,
)
from backfill_tests.policy_helpers import COURSE_V5

POSTS = 40
MAX_LINES = 4


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "backfill_assets.cli.batch_run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _state(engine: Any) -> dict[str, int]:
    return dict(Counter(r.state for r in rows(engine, "SELECT state FROM batch_submissions")))


@pytest.mark.parametrize("point", ["intent", "upload", "create", "poll", "fetch"])
def test_sigkill_at_each_step_never_creates_a_second_batch(
    point: str, tmp_path: Path, start_sim: StartSim
) -> None:
    # Long enough processing that the first status poll finds the batch still running, even
    # on a loaded machine (all chunks are created before the first poll).
    sim = start_sim(batch_processing_ms=1000, seed=8)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = engine_for(url)
    data = records(["acme"], POSTS)
    import_records(engine, tmp_path, data)
    env = clean_env(
        DAGSTER_HOME=str(tmp_path / "dagster_home"),
        BACKFILL_DATABASE_URL=url,
        BACKFILL_MODEL_BACKEND="openai",
        BACKFILL_MODEL_BASE_URL=sim.base_url,
        BACKFILL_MODEL_API_KEY=API_KEY,
        BACKFILL_BATCH_POLL_SECONDS="0.01",
        BACKFILL_BATCH_MAX_LINES=str(MAX_LINES),
    )

    killed = _run({**env, "BACKFILL_KILL_AT": point})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    before = sim.meter.snapshot()
    states = _state(engine)
    # Where the kill left the first chunk (and the provider). Every chunk's intent is
    # recorded before the first upload, so later chunks wait in 'intent'.
    uploads, creates = before.files_uploaded, before.batch_creates_total
    if point == "intent":
        assert (states, uploads, creates) == ({"intent": 1}, 0, 0)
    elif point == "upload":  # uploaded, but the file id was never stored
        assert (set(states), uploads, creates) == ({"intent"}, 1, 0)
    elif point == "create":  # created, but the batch id was never stored
        assert (states.get("uploaded"), uploads, creates) == (1, 1, 1)
    elif point == "poll":
        assert states.get("submitted", 0) >= 1 and "booked" not in states
    else:
        assert states.get("ended") == 1
    # Each recorded chunk's lines got their attempt events with the intent, before any upload.
    [(attempts,)] = rows(engine, "SELECT count(*) FROM ledger_events WHERE type = 'attempt'")
    [(lines,)] = rows(engine, "SELECT sum(lines) FROM batch_submissions")
    assert attempts == lines > 0

    resumed = _run(env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    doc = last_json(resumed.stdout)
    meter = sim.meter.snapshot()
    chunks = {r.chunk_id for r in rows(engine, "SELECT chunk_id FROM batch_submissions")}
    assert meter.batch_creates_by_chunk == dict.fromkeys(chunks, 1)
    assert doc["chunks"] == {"booked": len(chunks)}
    per_key = Counter(call.correlation_id for call in meter.billed.values())
    assert len(per_key) == POSTS and set(per_key.values()) == {1}
    if point == "create":
        assert "re-attached to batch" in resumed.stderr
    if point == "upload":
        assert meter.files_uploaded == len(chunks) + 1  # one orphan file, which costs nothing

    verified = verify_store(engine, VERSIONS).as_dict(require_complete=True)
    assert verified["ok"], verified["problems"]
    [tenant] = verified["tenants"]
    assert (tenant["done"], tenant["rebilled_tokens"], tenant["orphan_attempts"]) == (POSTS, 0, 0)
    assert tenant["billed_tokens"] == meter.billed_tokens_total
    captured = killed.stdout + killed.stderr + resumed.stdout + resumed.stderr
    assert API_KEY not in captured
    assert not [r["text"] for r in data if r["text"] in captured]


def test_a_batch_in_flight_across_a_policy_change_keeps_its_own_keys(
    tmp_path: Path, start_sim: StartSim
) -> None:
    sim = start_sim(batch_processing_ms=1000, seed=8)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = engine_for(url)
    import_records(engine, tmp_path, records(["acme"], 12))
    env = clean_env(
        DAGSTER_HOME=str(tmp_path / "dagster_home"),
        BACKFILL_DATABASE_URL=url,
        BACKFILL_MODEL_BACKEND="openai",
        BACKFILL_MODEL_BASE_URL=sim.base_url,
        BACKFILL_MODEL_API_KEY=API_KEY,
        BACKFILL_BATCH_POLL_SECONDS="0.01",
    )
    assert _run({**env, "BACKFILL_KILL_AT": "poll"}).returncode == -signal.SIGKILL
    old_keys = {r.key for r in rows(engine, "SELECT key FROM batch_lines")}
    # A new policy while the batches run (other labels): new keys, and the paid batches still
    # get booked, judged by the labels of the policy they were sent under.
    resumed = _run({**env, "BACKFILL_POLICY_PATH": str(COURSE_V5)})
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    results = rows(engine, "SELECT key, key_version FROM results")
    by_version = Counter(r.key_version for r in results)
    assert len(by_version) == 2 and by_version[VERSIONS.key_version] == len(old_keys)
    assert {r.key for r in results if r.key_version == VERSIONS.key_version} == old_keys
    meter = sim.meter.snapshot()
    assert set(Counter(c.correlation_id for c in meter.billed.values()).values()) == {1}
    new_versions = VERSIONS.__class__(
        VERSIONS.task_version,
        next(v for v in by_version if v != VERSIONS.key_version),
        VERSIONS.model,
    )
    old = "SELECT label FROM results WHERE key_version = :v"
    labels = {r.label for r in rows(engine, old, v=VERSIONS.key_version)}
    assert labels and labels <= set(RUBRIC.policy.label_ids)
    for versions in (VERSIONS, new_versions):
        verified = verify_store(engine, versions).as_dict()
        assert verified["ok"], verified["problems"]  # old rows are stale, not foreign
    assert verify_store(engine, new_versions).reports[0].missing == 0
