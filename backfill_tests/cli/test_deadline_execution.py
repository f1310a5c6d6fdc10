"""``run --deadline`` carried out against the simulator, with batch timing controlled, on both
stores: the tiers the plan picks, the switch-over that cancels stalled batches, a SIGKILL in
the middle of it, and the guarantee under all of them: every key labelled, none paid twice,
the deadline met."""

from __future__ import annotations

import datetime as dt
import signal
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from backfill_assets.orchestration.engines import engine_for
from backfill_assets.providersim.runner import Simulator
from backfill_tests.cli_runs import clean_env, last_json, run_cli
from backfill_tests.conftest import StartSim, import_records

pytestmark = pytest.mark.slow

TENANTS = ("acme", "globex")
PER_TENANT = 150
KEYS = len(TENANTS) * PER_TENANT


def _setup(store_url: str, tmp_path: Path, sim: Simulator, **env: str) -> dict[str, str]:
    import_records(
        engine_for(store_url),
        tmp_path,
        [
            {"tenant_id": t, "post_id": f"p{i}", "text": f"{t} post {i}: arrived on time"}
            for t in TENANTS
            for i in range(PER_TENANT)
        ],
    )
    return clean_env(
        DAGSTER_HOME=str(tmp_path / "home"),
        BACKFILL_DATABASE_URL=store_url,
        BACKFILL_MODEL_BACKEND="openai",
        BACKFILL_MODEL="gpt-4o-mini",
        BACKFILL_MODEL_BASE_URL=sim.base_url,
        BACKFILL_MODEL_API_KEY="sk-test-deadline",
        BACKFILL_BATCH_POLL_SECONDS="0.05",
        BACKFILL_RUN_PROCESSES="1",
        **env,
    )


def _run(env: dict[str, str], *argv: str) -> tuple[int, dict[str, Any], str]:
    done = run_cli(["run", *argv, "--json"], env, timeout=240)
    doc = last_json(done.stdout) if done.stdout.strip() else {}
    return done.returncode, doc, done.stderr


def _paid(sim: Simulator) -> dict[str, int]:
    """Keys billed, by tier (a batch line, flex or standard); fails on a key paid twice."""
    snap = sim.meter.snapshot()
    twice = {k: b.requests for k, b in snap.billed_by_correlation_id.items() if b.requests > 1}
    assert twice == {}, f"keys paid twice: {twice}"
    tiers = {"batch": 0, "flex": 0, "standard": 0}
    for call in snap.billed.values():
        tier = "batch" if call.batch_id else ("flex" if call.service_tier == "flex" else "standard")
        tiers[tier] += 1
    return tiers


def _met(doc: dict[str, Any]) -> None:
    info = doc["deadline"]
    assert info["met"] is True
    assert dt.datetime.fromisoformat(info["labelled_at"]) <= dt.datetime.fromisoformat(
        info["deadline"]
    )


def _ui_plan(home: Path) -> str:
    """The deadline plan as the UI shows it: backfill_plan's latest metadata."""
    with dg.DagsterInstance.from_config(str(home)) as inst:
        event = inst.get_latest_materialization_event(dg.AssetKey("backfill_plan"))
        assert event is not None and event.asset_materialization is not None
        value = event.asset_materialization.metadata["deadline_plan"].value
    assert isinstance(value, str)
    return value


def test_a_long_deadline_sends_everything_through_batch(
    store_url: str, tmp_path: Path, start_sim: StartSim
) -> None:
    sim = start_sim(seed=5)
    env = _setup(store_url, tmp_path, sim, BACKFILL_RPM="60")
    code, doc, err = _run(env, "--deadline", "3d")
    assert code == 0, err
    assert doc["deadline"]["plan"]["keys"] == {"batch": KEYS, "flex": 0, "standard": 0}
    _met(doc)
    assert _paid(sim) == {"batch": KEYS, "flex": 0, "standard": 0}
    steps = {s["name"]: s for s in doc["deadline"]["steps"]}
    assert steps["sync"]["skipped"] and steps["rescue"]["skipped"]
    # The UI followed the plan: after the wait, nothing left, on time.
    shown = _ui_plan(tmp_path / "home")
    assert doc["deadline"]["plan_id"] in shown and f"| 0 of {KEYS} |" in shown
    assert "(on time)" in shown
    # The record run labelled, checked and applied every partition without a model call.
    assert doc["ok"] and doc["totals"]["model_calls"] == 0
    # Finished: the next run --deadline makes a new plan, with nothing left to send.
    code, doc, err = _run(env, "--deadline", "3d")
    assert code == 0, err
    assert doc["deadline"]["resumed"] is False
    assert sum(doc["deadline"]["plan"]["keys"].values()) == 0
    assert _paid(sim)["batch"] == KEYS


def test_a_deadline_shorter_than_any_batch_uses_flex_then_standard_in_time(
    store_url: str, tmp_path: Path, start_sim: StartSim
) -> None:
    # Flex is down: after what the plan can spare, the rest goes at standard.
    sim = start_sim(seed=5, flex_unavailable_share=1.0)
    env = _setup(store_url, tmp_path, sim, BACKFILL_RPM="60000", BACKFILL_SERVICE_TIER="flex")
    code, doc, err = _run(env, "--deadline", "20s")
    assert code == 0, err
    plan = doc["deadline"]["plan"]
    assert plan["keys"]["batch"] == 0 and plan["keys"]["flex"] > 0
    _met(doc)
    paid = _paid(sim)
    assert paid == {"batch": 0, "flex": 0, "standard": KEYS}
    assert "flex tier unavailable" in err


def test_a_deadline_shorter_than_any_batch_with_flex_up_pays_flex(
    store_url: str, tmp_path: Path, start_sim: StartSim
) -> None:
    sim = start_sim(seed=5)
    env = _setup(store_url, tmp_path, sim, BACKFILL_RPM="60000", BACKFILL_SERVICE_TIER="flex")
    code, doc, err = _run(env, "--deadline", "1h")
    assert code == 0, err
    _met(doc)
    assert _paid(sim) == {"batch": 0, "flex": KEYS, "standard": 0}


def _stalling(start_sim: StartSim) -> Simulator:
    # A batch would take 40 s; the plan assumes 1 s (BACKFILL_BATCH_PRIOR_SECONDS).
    return start_sim(seed=5, batch_processing_ms=40_000.0)


STALL_ENV = {"BACKFILL_RPM": "12000", "BACKFILL_BATCH_PRIOR_SECONDS": "1"}


def test_stalled_batches_are_cancelled_at_the_switch_over_and_the_rest_sent(
    store_url: str, tmp_path: Path, start_sim: StartSim
) -> None:
    sim = _stalling(start_sim)
    env = _setup(store_url, tmp_path, sim, **STALL_ENV)
    code, doc, err = _run(env, "--deadline", "14s", "--margin", "30")
    assert code == 0, err
    info = doc["deadline"]
    assert info["plan"]["keys"]["batch"] == KEYS and info["switch_over"]
    assert "switch-over: cancelling" in err
    _met(doc)
    paid = _paid(sim)
    # The cancelled batches returned (and billed) what they had completed; the rest went
    # at standard. Each key once.
    assert 0 < paid["batch"] < KEYS and paid["batch"] + paid["standard"] == KEYS
    steps = {s["name"]: s for s in info["steps"]}
    assert steps["rescue"]["calls"] == paid["standard"]
    assert doc["ok"]


def test_a_sigkill_during_the_switch_over_resumes_the_same_plan(
    store_url: str, tmp_path: Path, start_sim: StartSim
) -> None:
    sim = _stalling(start_sim)
    env = _setup(store_url, tmp_path, sim, **STALL_ENV)
    # A wide margin: the restart (a new process loading Dagster) takes seconds here, more on
    # a busy machine.
    code, _, err = _run(
        {**env, "BACKFILL_KILL_AT": "cancel"}, "--deadline", "20s", "--margin", "50"
    )
    assert code == -signal.SIGKILL, err
    assert "BACKFILL_KILL_AT=cancel: SIGKILL" in err
    # Resumed with another deadline on the command line: the stored one holds.
    code, doc, err = _run(env, "--deadline", "30d")
    assert code == 0, err
    info = doc["deadline"]
    assert info["resumed"] is True and "resuming plan" in err
    first = dt.datetime.fromisoformat(info["plan"]["now"])
    assert dt.datetime.fromisoformat(info["deadline"]) - first < dt.timedelta(seconds=21)
    _met(doc)
    paid = _paid(sim)
    assert paid["batch"] + paid["standard"] == KEYS
    assert doc["ok"]
