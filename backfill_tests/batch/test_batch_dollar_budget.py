"""Budgets in dollars in batch mode: each chunk reserves its lines' bounds at the Batch API's
price with its intent, so a capped tenant is never billed past its cap, whatever the provider
bills; the rest of its keys wait for a later run."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.core.limits import Spend
from backfill_assets.store.submissions import open_reserved
from backfill_tests.batch.conftest import StartSim, batch_options, run_batch
from backfill_tests.conftest import import_records
from backfill_tests.http.test_dollar_budget import booked, corpus, set_dollar_caps

TENANTS = ["acme", "globex", "initech"]
POSTS = 120


def test_the_dollar_cap_holds_in_batch_mode_under_three_times_overbilling(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    import_records(engine, tmp_path, corpus(TENANTS, POSTS))
    caps = set_dollar_caps(engine, {"acme": "0.0005", "globex": "0.0003"})
    sim = start_sim(prompt_token_factor=3.0)
    reports = run_batch(engine, TENANTS, batch_options(sim, max_lines=25))
    got = booked(engine)
    meter = sim.meter.snapshot()
    assert sum(c for _, c, _ in got.values()) == meter.billed_cost_nanos > 0
    assert all(c == b for _, c, b in got.values()), got
    for tenant, cap in caps.items():
        calls, cost, _ = got[tenant]
        assert 0 < cost <= cap, (tenant, cost, cap)
        assert calls < POSTS
    assert got["initech"][0] == POSTS
    deferred = sum(r.stats.outcomes["deferred"] for r in reports)
    assert deferred == 2 * POSTS - got["acme"][0] - got["globex"][0]
    with engine.connect() as conn:
        tiers = set(
            conn.execute(
                sa.text("SELECT DISTINCT service_tier FROM ledger_events WHERE type = 'usage'")
            ).scalars()
        )
        # Every chunk was booked: nothing is still held.
        held = open_reserved(conn, "acme") + open_reserved(conn, "globex")
    assert tiers == {"batch"} and held == Spend()
