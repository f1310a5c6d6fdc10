"""``ledger/spend/deadline_plans.py``: what a resumed run of a plan already booked at flex (per
tenant, keys once, since the plan was made, at its model), and the rates of a plan stored
before cancels were planned for (both stores)."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from sqlalchemy.engine import Engine

from backfill_assets.domain.money.tier_split import Rates
from backfill_assets.ledger.engine import read_tx, write_tx
from backfill_assets.ledger.spend import deadline_plans
from backfill_assets.ledger.tables import ledger_events, utcnow

DOC: dict[str, Any] = {
    "tenants": [
        {"tenant": "acme", "keys": {"batch": 0, "flex": 5, "standard": 1}},
        {"tenant": "globex", "keys": {"batch": 2, "flex": 3, "standard": 0}},
    ],
    "rates": {
        "standard_per_s": 10.0,
        "flex_per_s": 10.0,
        "flex_unavailable": 0.25,
        "batch_completion_s": None,
        "batch_cancel_s": 630.0,
    },
    "flex_until": "2026-12-07T10:00:36+00:00",
}


def _usage(tenant: str, key: str, tier: str, at: dt.datetime, model: str = "m") -> dict[str, Any]:
    return {
        "tenant_id": tenant,
        "key": key,
        "attempt_id": f"{key}-{at.timestamp()}",
        "attempt_no": 1,
        "type": "usage",
        "slice": 0,
        "model": model,
        "tokens_in": 1,
        "tokens_out": 1,
        "cost_nanos": 1,
        "run_id": "r",
        "at": at,
        "tokens_cached": 0,
        "tokens_cache_written": 0,
        "service_tier": tier,
        "cost_unknown": 0,
        "tokens_reasoning": 0,
    }


def test_the_flex_keys_a_plan_already_booked(engine: Engine) -> None:
    with write_tx(engine) as conn:
        deadline_plans.create_plan(conn, "cv", "m", dt.datetime(2026, 12, 8), None, DOC)
        plan = deadline_plans.open_plan(conn, "cv")
    assert plan is not None
    later, earlier = utcnow() + dt.timedelta(seconds=5), plan.created_at - dt.timedelta(hours=1)
    rows = [
        _usage("acme", "k1", "flex", later),
        _usage("acme", "k1", "flex", later + dt.timedelta(seconds=1)),  # paid twice: one key
        _usage("acme", "k2", "standard", later),
        _usage("acme", "k0", "flex", earlier),  # before the plan
        _usage("globex", "k3", "flex", later, model="other"),
        _usage("initech", "k4", "flex", later),  # not the plan's
    ]
    with write_tx(engine) as conn:
        conn.execute(ledger_events.insert(), rows)
    with read_tx(engine) as conn:
        assert deadline_plans.flex_booked(conn, plan, "m") == {"acme": 1}
    assert plan.flex_quota() == {"acme": 5, "globex": 3}
    assert plan.batch_quota() == {"acme": 0, "globex": 2}
    assert plan.rates() == Rates(10.0, 10.0, 0.25, math.inf, 630.0)
    assert plan.flex_until == dt.datetime(2026, 12, 7, 10, 0, 36)


def test_a_plan_stored_before_cancels_were_planned_reads_the_limit_as_standards() -> None:
    # Then standard_per_s was the share flex refused and flex_per_s the whole limit.
    old = {
        "standard_per_s": 2.5,
        "flex_per_s": 10.0,
        "flex_unavailable": 0.25,
        "batch_completion_s": 86400.0,
    }
    plan = deadline_plans.StoredPlan(
        plan_id="p",
        code_version="cv",
        created_at=dt.datetime(2026, 12, 7),
        deadline=dt.datetime(2026, 12, 8),
        switch_over=None,
        plan={"tenants": [], "rates": old},
        submitted_at=None,
        switched_at=None,
        finished_at=None,
    )
    assert plan.rates() == Rates(10.0, 10.0, 0.25, 86400.0, 0.0)
    assert plan.flex_until is None and plan.sync_per_s == 10.0
