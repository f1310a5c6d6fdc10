"""Budgets in dollars, strict by reservation, against the simulator's own priced meter: at
concurrency 64, with the provider billing three times the prompt tokens, no capped tenant is
billed a nano-dollar past its cap, at the standard or the flex tier; what is booked is what
the simulator billed; keys that do not fit are deferred, not lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.config.variables import RunSettings
from backfill_assets.dispatch.partition_run import PartitionReport
from backfill_assets.dispatch.pipeline import RunOptions
from backfill_assets.domain.money.budgets import Caps
from backfill_assets.domain.money.nanos import nanos_of_usd
from backfill_assets.domain.money.prices import PriceTable, Tier
from backfill_assets.domain.work.outcomes import RetryPolicy
from backfill_assets.ledger.spend.budget import set_caps
from backfill_assets.providers.ratelimit import EndpointLimiter, LimiterConfig
from backfill_assets.providersim import Simulator
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import varied_corpus
from backfill_tests.providers.conftest import StartSim, run_over_http

TENANTS = ["acme", "globex", "initech"]
# initech has no cap: it must finish, whatever the others' caps do.
CAPS_USD = {"acme": "0.01", "globex": "0.004"}
POSTS = 150
RETRY = RetryPolicy(
    max_attempts=3, retry_base_seconds=0.0, retry_max_seconds=0.0, retry_after_max_seconds=900.0
)


def set_dollar_caps(engine: Engine, caps_usd: dict[str, str]) -> dict[str, int]:
    """Give tenants dollar caps (as ``tenant set-budget --usd`` does); returns them in nanos."""
    nanos = {t: nanos_of_usd(v) for t, v in caps_usd.items()}
    with engine.begin() as conn:
        for tenant, cap in nanos.items():
            set_caps(conn, tenant, Caps(nanos=cap))
    return nanos


def booked(engine: Engine) -> dict[str, tuple[int, int, int]]:
    """Per tenant: usage events, their cost and the tenant's billed_nanos."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT t.tenant_id, count(e.id), coalesce(sum(e.cost_nanos), 0), t.billed_nanos"
                " FROM tenants t LEFT JOIN ledger_events e"
                " ON e.tenant_id = t.tenant_id AND e.type = 'usage'"
                " GROUP BY t.tenant_id, t.billed_nanos"
            )
        ).all()
    return {str(t): (int(n), int(c), int(b)) for t, n, c, b in rows}


def usage_tiers(engine: Engine) -> set[str]:
    """The tiers usage events were booked at."""
    with engine.connect() as conn:
        return set(
            conn.execute(
                sa.text("SELECT DISTINCT service_tier FROM ledger_events WHERE type = 'usage'")
            ).scalars()
        )


def assert_caps_held(
    engine: Engine,
    sim: Simulator,
    reports: list[PartitionReport],
    caps: dict[str, int],
    posts: int,
    uncapped: str = "initech",
) -> dict[str, tuple[int, int, int]]:
    """What every dollar-cap run must show; returns the bookings for more checks. The ledger
    is the simulator's bill to the nano-dollar and every tenant's total is its events' sum;
    each capped tenant is within its cap with keys left; the uncapped one got all of its
    posts; the keys not sent were deferred, not lost."""
    got = booked(engine)
    meter = sim.meter.snapshot()
    assert sum(c for _, c, _ in got.values()) == meter.billed_cost_nanos > 0
    assert all(c == b for _, c, b in got.values()), got
    for tenant, cap in caps.items():
        calls, cost, _ = got[tenant]
        assert 0 < cost <= cap, (tenant, cost, cap)
        assert calls < posts
    assert got[uncapped][0] == posts
    deferred = sum(r.stats.outcomes["deferred"] for r in reports)
    assert deferred == len(caps) * posts - sum(got[t][0] for t in caps)
    return got


def left_reserved(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM budget_reservations")).scalar_one())


@pytest.mark.parametrize("tier", [Tier.STANDARD, Tier.FLEX])
def test_the_dollar_cap_holds_at_concurrency_64_under_three_times_overbilling(
    engine: Engine, tmp_path: Path, start_sim: StartSim, tier: Tier
) -> None:
    import_records(engine, tmp_path, varied_corpus(TENANTS, POSTS))
    caps = set_dollar_caps(engine, CAPS_USD)
    sim = start_sim(prompt_token_factor=3.0)
    adapter: dict[str, Any] = {"tier": tier}
    reports = run_over_http(
        engine,
        sim,
        TENANTS,
        limiter=EndpointLimiter(LimiterConfig()),
        options=RunOptions(run=RunSettings(concurrency=64), seed=5, retry=RETRY),
        **adapter,
    )
    got = assert_caps_held(engine, sim, reports, caps, POSTS)
    for tenant, cap in caps.items():
        # Strict, not timid: the cap is mostly used before keys are deferred.
        assert got[tenant][1] > cap // 2, (tenant, got[tenant][1], cap)
    assert left_reserved(engine) == 0
    # Booked at the tier the answers reported, over-billed tokens and all.
    assert usage_tiers(engine) == {tier.value}


def test_an_unpriced_model_under_a_dollar_cap_sends_nothing_for_that_tenant(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    """A dollar cap cannot be kept without a price: that tenant's keys wait, the others run."""
    import_records(engine, tmp_path, varied_corpus(["acme", "initech"], 10))
    set_dollar_caps(engine, {"acme": "5"})
    sim = start_sim()
    run_over_http(
        engine,
        sim,
        ["acme", "initech"],
        options=RunOptions(run=RunSettings(concurrency=8), seed=5, retry=RETRY),
        prices=PriceTable({}),
    )
    got = booked(engine)
    assert got["acme"][0] == 0 and got["initech"][0] == 10
