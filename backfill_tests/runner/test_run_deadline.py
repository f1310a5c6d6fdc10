"""``run --deadline``: the plan from this store's history and the configured limit, printed
by ``--dry-run``; an impossible deadline refused before any request (both stores)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from backfill_assets.cli import main
from backfill_assets.ledger import tables
from backfill_assets.ledger.engines import engine_for
from backfill_assets.ledger.run import batch_cancels
from backfill_assets.ledger.spend import deadline_plans
from backfill_assets.ledger.tables import batch_submissions
from backfill_tests.cli_runs import clear_settings, last_json
from backfill_tests.conftest import StartSim, import_records

TENANTS = ("acme", "globex")
PER_TENANT = 150


@pytest.fixture
def cli(
    store_url: str, tmp_path: Path, start_sim: StartSim, monkeypatch: pytest.MonkeyPatch
) -> Any:
    sim = start_sim(seed=5)
    import_records(
        engine_for(store_url),
        tmp_path,
        [
            {"tenant_id": t, "post_id": f"p{i}", "text": f"{t} post {i}: arrived on time"}
            for t in TENANTS
            for i in range(PER_TENANT)
        ],
    )
    clear_settings(monkeypatch)
    env = {
        "DAGSTER_HOME": str(tmp_path / "home"),
        "BACKFILL_DATABASE_URL": store_url,
        "BACKFILL_MODEL_BACKEND": "openai",
        "BACKFILL_MODEL": "gpt-4o-mini",
        "BACKFILL_MODEL_BASE_URL": sim.base_url,
        "BACKFILL_MODEL_API_KEY": "sk-test-deadline",
        "BACKFILL_RPM": "60",  # one key per second: 300 keys take 5 minutes
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any], str]:
        code = main(["run", *args, "--json"])
        out, err = capsys.readouterr()
        doc = last_json(out) if out.strip() else {}
        return code, doc, err

    run.sim = sim  # type: ignore[attr-defined]
    return run


def _billed(cli: Any) -> int:
    return len(cli.sim.meter.snapshot().billed)


def test_a_long_deadline_plans_everything_on_batch(
    cli: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc, err = cli(["--deadline", "3d", "--dry-run"], capsys)
    assert code == 0, err
    plan = doc["plan"]
    assert plan["feasible"] and plan["keys"] == {"batch": 300, "flex": 0, "standard": 0}
    assert plan["switch_over"] is not None
    assert plan["rates"]["batch_completion_s"] == 86_400.0  # the pessimistic prior
    assert plan["rates"]["standard_per_s"] == 1.0
    assert plan["cost_usd"] == plan["cost_all_batch_usd"]
    assert sorted(t["tenant"] for t in plan["tenants"]) == sorted(TENANTS)
    assert _billed(cli) == 0


def test_a_deadline_shorter_than_a_batch_goes_synchronous(
    cli: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc, _ = cli(["--deadline", "2h", "--dry-run"], capsys)
    assert code == 0
    assert doc["plan"]["keys"] == {"batch": 0, "flex": 0, "standard": 300}
    assert doc["plan"]["switch_over"] is None
    assert doc["plan"]["cost_usd"] == doc["plan"]["cost_all_standard_usd"]


def test_this_stores_batch_history_replaces_the_prior(
    cli: Any, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Three batches that completed in 10 minutes: a 2-hour deadline can now use batch.
    t0 = dt.datetime(2026, 11, 1, 12, 0)
    with engine_for(store_url).begin() as conn:
        for i in range(3):
            conn.execute(
                sa.insert(batch_submissions),
                {
                    "chunk_id": f"c{i}",
                    "chunk_base": f"b{i}",
                    "seq": 0,
                    "tenant_id": "acme",
                    "slice": 0,
                    "model": "gpt-4o-mini",
                    "key_version": "p",
                    "task_version": "t",
                    "lines": 10,
                    "file_sha256": "0" * 64,
                    "file_bytes": 1,
                    "batch_id": f"batch_{i}",
                    "state": "booked",
                    "provider_status": "completed",
                    "run_id": "r",
                    "intent_at": t0,
                    "submitted_at": t0,
                    "finished_at": t0 + dt.timedelta(minutes=10),
                },
            )
    code, doc, _ = cli(["--deadline", "2h", "--dry-run"], capsys)
    assert code == 0
    plan = doc["plan"]
    assert plan["rates"]["batch_completion_s"] == 600.0
    assert plan["keys"] == {"batch": 300, "flex": 0, "standard": 0}
    # The switch-over leaves the cancels their time (no history of them: the documented
    # 10 minutes, and one 30 s status poll to see them end), then the synchronous tier the
    # 300 s it needs to rescue a stall.
    assert plan["rates"]["batch_cancel_s"] == 630.0
    switch = dt.datetime.fromisoformat(plan["switch_over"])
    deadline = dt.datetime.fromisoformat(plan["deadline"])
    now = dt.datetime.fromisoformat(plan["now"])
    assert switch == now + (deadline - now) * 0.9 - dt.timedelta(seconds=630 + 300)


def _cancels(store_url: str, endpoint: str, *seconds: float) -> None:
    with engine_for(store_url).begin() as conn:
        for s in seconds:
            batch_cancels.record_cancel(
                conn,
                f"batch_{endpoint[-4:]}_{s}",
                endpoint,
                "gpt-4o-mini",
                s,
                dt.datetime(2026, 11, 1, 12, 0) + dt.timedelta(seconds=s),
            )


def test_the_time_a_cancel_takes_comes_from_this_stores_cancels_at_the_endpoint(
    cli: Any, store_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BACKFILL_BATCH_POLL_SECONDS", "5")
    # The setting, until the endpoint has 3 cancels of the model.
    monkeypatch.setenv("BACKFILL_BATCH_CANCEL_SECONDS", "120")
    code, doc, _ = cli(["--deadline", "3d", "--dry-run"], capsys)
    assert code == 0 and doc["plan"]["rates"]["batch_cancel_s"] == 125.0
    here = batch_cancels.endpoint_id(cli.sim.base_url)
    _cancels(store_url, "https://elsewhere.example/v1", 900.0, 900.0, 900.0)
    _cancels(store_url, here, 40.0, 70.0)
    code, doc, _ = cli(["--deadline", "3d", "--dry-run"], capsys)
    assert code == 0 and doc["plan"]["rates"]["batch_cancel_s"] == 125.0
    # Three of them: the longest, whatever the setting says.
    _cancels(store_url, here, 55.0)
    code, doc, _ = cli(["--deadline", "3d", "--dry-run"], capsys)
    assert code == 0 and doc["plan"]["rates"]["batch_cancel_s"] == 75.0
    plan = doc["plan"]
    switch = dt.datetime.fromisoformat(plan["switch_over"])
    deadline = dt.datetime.fromisoformat(plan["deadline"])
    now = dt.datetime.fromisoformat(plan["now"])
    assert switch == now + (deadline - now) * 0.9 - dt.timedelta(seconds=75 + 300)


def test_an_impossible_deadline_is_refused_before_any_request(
    cli: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # 300 keys at one per second need 5 minutes; batch a day.
    for extra in ([], ["--dry-run"]):
        code, doc, _ = cli(["--deadline", "2m", *extra], capsys)
        assert code == 2 and doc["ok"] is False and not doc["plan"]["feasible"]
        assert "300 key(s) need 5.0 min" in doc["plan"]["reasons"][0]
    assert _billed(cli) == 0 and cli.sim.meter.snapshot().requests_total == 0


def test_bad_deadlines_and_flags_exit_2_naming_them(
    cli: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "--deadline", "friday"])
    assert code == 2 and "--deadline: unreadable deadline 'friday'" in capsys.readouterr().err
    code = main(["run", "--deadline", "2020-01-01T00:00Z", "--dry-run"])
    assert code == 2 and "is not after now" in capsys.readouterr().err
    code = main(["run", "--dry-run"])
    assert code == 2 and "go with --deadline" in capsys.readouterr().err
    code = main(["run", "--replan"])
    assert code == 2 and "go with --deadline" in capsys.readouterr().err
    code = main(["run", "--deadline", "3d", "--slice", "s00"])
    assert code == 2 and "not with --sample, --slice or --force" in capsys.readouterr().err
    assert cli.sim.meter.snapshot().requests_total == 0


def test_flex_plans_take_the_refused_share_from_this_stores_history(
    cli: Any, store_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BACKFILL_SERVICE_TIER", "flex")
    code, doc, _ = cli(["--deadline", "2h", "--dry-run"], capsys)
    assert code == 0
    rates = doc["plan"]["rates"]
    # The prior: flex refuses 25%; flex and standard share the whole limit.
    assert rates["flex_unavailable"] == 0.25
    assert rates["flex_per_s"] == 1.0 and rates["standard_per_s"] == 1.0
    assert doc["plan"]["keys"] == {"batch": 0, "flex": 300, "standard": 0}
    # 200 flex requests under an earlier plan, 120 refused: the history replaces the prior.
    with engine_for(store_url).begin() as conn:
        deadline_plans.create_plan(
            conn, "other-version", "gpt-4o-mini", dt.datetime(2026, 12, 1), None, {"tenants": []}
        )
        plan_id = conn.execute(sa.select(tables.deadline_plans.c.plan_id)).scalar_one()
        deadline_plans.add_flex_calls(conn, plan_id, 200, 120)
    code, doc, _ = cli(["--deadline", "2h", "--dry-run"], capsys)
    assert code == 0 and doc["plan"]["rates"]["flex_unavailable"] == 0.6
    # A short deadline: flex can finish only part in time, the rest goes to standard.
    code, doc, _ = cli(["--deadline", "6m", "--dry-run"], capsys)
    assert code == 0
    keys = doc["plan"]["keys"]
    assert keys["batch"] == 0 and 0 < keys["flex"] < 300 and keys["flex"] + keys["standard"] == 300


def test_a_tenant_whose_dollar_budget_cannot_cover_its_keys_is_named_in_the_plan(
    cli: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tenant", "set-budget", "acme", "--usd", "0.000001"]) == 0
    capsys.readouterr()
    code, doc, _ = cli(["--deadline", "3d", "--dry-run"], capsys)
    assert code == 0
    tenants = {t["tenant"]: t for t in doc["plan"]["tenants"]}
    assert tenants["acme"]["over_budget"] and tenants["acme"]["budget_left_usd"] == "0.000001000"
    assert not tenants["globex"]["over_budget"]
    assert any(r.startswith("tenant acme: planned $") for r in doc["plan"]["reasons"])
    assert _billed(cli) == 0
