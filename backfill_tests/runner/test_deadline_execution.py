"""``run --deadline`` carried out against the simulator, with batch timing controlled, on both
stores: the tiers the plan picks, the switch-over that cancels stalled batches, a SIGKILL in
the middle of it, and the guarantee under all of them: every key labelled, none paid twice,
the deadline met."""

from __future__ import annotations

import datetime as dt
import signal
from decimal import Decimal
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from backfill_assets.domain.money.nanos import usd
from backfill_assets.domain.work.events import EventKind
from backfill_assets.ledger.engines import engine_for
from backfill_assets.ledger.tables import ledger_events, results
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


def _booked(store_url: str) -> tuple[dict[str, dict[str, int]], str]:
    """Keys booked per tenant and tier (from the ledger's usage events), and their cost."""
    c = ledger_events.c
    with engine_for(store_url).connect() as conn:
        rows = conn.execute(
            sa.select(c.tenant_id, c.service_tier, sa.func.count(), sa.func.sum(c.cost_nanos))
            .where(c.type == EventKind.USAGE)
            .group_by(c.tenant_id, c.service_tier)
        ).all()
    keys: dict[str, dict[str, int]] = {t: {"batch": 0, "flex": 0, "standard": 0} for t in TENANTS}
    for tenant, tier, n, _ in rows:
        keys[tenant]["flex" if tier == "flex" else "standard"] += int(n)
    return keys, str(usd(sum(int(r[3]) for r in rows)))


def test_the_run_pays_the_tiers_its_dry_run_showed(
    store_url: str, tmp_path: Path, start_sim: StartSim
) -> None:
    # 300 keys at 600 RPM take 30 s at standard; a 60 s deadline leaves 54 s. The dry-run and
    # the run must agree on which keys go flex: the run pays the tiers the plan priced.
    sim = start_sim(seed=5)
    env = _setup(store_url, tmp_path, sim, BACKFILL_RPM="600", BACKFILL_SERVICE_TIER="flex")
    code, dry, err = _run(env, "--deadline", "60s", "--dry-run")
    assert code == 0, err
    code, doc, err = _run(env, "--deadline", "60s")
    assert code == 0, err
    _met(doc)
    planned = {t["tenant"]: t["keys"] for t in dry["plan"]["tenants"]}
    assert {t["tenant"]: t["keys"] for t in doc["deadline"]["plan"]["tenants"]} == planned
    keys, booked_usd = _booked(store_url)
    assert keys == planned
    assert sum(k["flex"] for k in keys.values()) > 0
    # The plan's cost is an upper bound (each answer at max_tokens): at the planned tiers the
    # run pays no more, and exactly what the provider billed.
    assert Decimal(booked_usd) <= Decimal(dry["plan"]["cost_usd"])
    assert Decimal(booked_usd) == usd(sim.meter.snapshot().billed_cost_nanos)
    assert _paid(sim) == {
        "batch": 0,
        "flex": sum(k["flex"] for k in keys.values()),
        "standard": sum(k["standard"] for k in keys.values()),
    }


def _stalling(start_sim: StartSim) -> Simulator:
    # A batch would take 40 s; the plan assumes 1 s (BACKFILL_BATCH_PRIOR_SECONDS).
    return start_sim(seed=5, batch_processing_ms=40_000.0)


# The simulator's cancels end within milliseconds: the plan allows none (and one status poll).
STALL_ENV = {
    "BACKFILL_RPM": "12000",
    "BACKFILL_BATCH_PRIOR_SECONDS": "1",
    "BACKFILL_BATCH_CANCEL_SECONDS": "0",
}


def test_stalled_batches_are_cancelled_at_the_switch_over_and_the_rest_sent(
    store_url: str, tmp_path: Path, start_sim: StartSim
) -> None:
    sim = _stalling(start_sim)
    env = _setup(store_url, tmp_path, sim, **STALL_ENV)
    # About 10 s to use (40 s, margin 75%): the switch-over comes as early as it would with a
    # tight deadline, and a loaded machine's slow start-up still has 30 s of slack.
    code, doc, err = _run(env, "--deadline", "40s", "--margin", "75")
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
    # About 10 s to use (60 s, margin 83%) and a wide slack: the restart (a new process
    # loading Dagster) takes seconds here, more on a busy machine.
    code, _, err = _run(
        {**env, "BACKFILL_KILL_AT": "cancel"}, "--deadline", "60s", "--margin", "83"
    )
    assert code == -signal.SIGKILL, err
    assert "BACKFILL_KILL_AT=cancel: SIGKILL" in err
    # Resumed with another deadline on the command line: the stored one holds.
    code, doc, err = _run(env, "--deadline", "30d")
    assert code == 0, err
    info = doc["deadline"]
    assert info["resumed"] is True and "resuming plan" in err
    first = dt.datetime.fromisoformat(info["plan"]["now"])
    assert dt.datetime.fromisoformat(info["deadline"]) - first < dt.timedelta(seconds=61)
    _met(doc)
    paid = _paid(sim)
    assert paid["batch"] + paid["standard"] == KEYS
    assert doc["ok"]


def _results(store_url: str) -> int:
    with engine_for(store_url).connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(results)).scalar_one())


def test_slow_cancels_are_planned_for_and_the_deadline_is_met(
    store_url: str, tmp_path: Path, start_sim: StartSim
) -> None:
    # Batches stall (2 min against a plan that assumes 1 s) and a cancel stays 'cancelling'
    # for 15 s. A 40 s deadline, margin 30%: 28 s to use. Switching over at 28 - 1.5 s (the
    # rescue of 300 keys at 200/s) would see the cancels end at 41.5 s, past the deadline;
    # the plan allows for them and switches over 15 s earlier.
    sim = start_sim(seed=5, batch_processing_ms=120_000.0, batch_cancel_ms=15_000.0)
    env = _setup(store_url, tmp_path, sim, **{**STALL_ENV, "BACKFILL_BATCH_CANCEL_SECONDS": "15"})
    code, doc, err = _run(env, "--deadline", "40s", "--margin", "30")
    assert code == 0, err
    info = doc["deadline"]
    plan = info["plan"]
    assert plan["keys"]["batch"] == KEYS and plan["rates"]["batch_cancel_s"] == 15.05
    now = dt.datetime.fromisoformat(plan["now"])
    switch = dt.datetime.fromisoformat(info["switch_over"])
    assert (switch - now).total_seconds() == pytest.approx(28 - 15.05 - KEYS / 200)
    assert "switch-over: cancelling" in err and "longer than the plan" not in err
    _met(doc)
    paid = _paid(sim)
    assert paid["batch"] + paid["standard"] == KEYS and _results(store_url) == KEYS
    assert doc["ok"]


def test_a_cancel_longer_than_planned_is_waited_for_and_learned(
    store_url: str, tmp_path: Path, start_sim: StartSim
) -> None:
    # The plan allows 2 s for a cancel; the provider takes 12 s. The run waits for every
    # cancel to end (a line may still complete and bill while 'cancelling'), so nothing is
    # paid twice and every key is labelled, but the deadline is missed by the overrun.
    sim = start_sim(seed=5, batch_processing_ms=120_000.0, batch_cancel_ms=12_000.0)
    env = _setup(store_url, tmp_path, sim, **{**STALL_ENV, "BACKFILL_BATCH_CANCEL_SECONDS": "2"})
    code, doc, err = _run(env, "--deadline", "20s", "--margin", "30")
    assert code == 1, err
    info = doc["deadline"]
    assert info["plan"]["keys"]["batch"] == KEYS and info["met"] is False
    assert "longer than the plan's 2s: waiting for it" in err
    paid = _paid(sim)  # fails on a key paid twice
    assert paid["batch"] + paid["standard"] == KEYS and _results(store_url) == KEYS
    # What the cancels took is stored: the next plan allows for it, whatever the setting.
    code, dry, err = _run(env, "--deadline", "3d", "--dry-run")
    assert code == 0, err
    assert 11.0 <= dry["plan"]["rates"]["batch_cancel_s"] - 0.05 <= 13.0
