"""Budgets in dollars in batch mode: each chunk reserves its lines' bounds at the Batch API's
price with its intent, so a capped tenant is never billed past its cap, whatever the provider
bills; the rest of its keys wait for a later run."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import Engine

from backfill_assets.domain.money.budgets import Spend
from backfill_assets.ledger.run.submissions import open_reserved
from backfill_tests.conftest import import_records
from backfill_tests.dispatch.batch.conftest import StartSim, batch_options, run_batch
from backfill_tests.pipeline_helpers import varied_corpus
from backfill_tests.providers.test_dollar_budget import (
    assert_caps_held,
    set_dollar_caps,
    usage_tiers,
)

TENANTS = ["acme", "globex", "initech"]
POSTS = 120


def test_the_dollar_cap_holds_in_batch_mode_under_three_times_overbilling(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    import_records(engine, tmp_path, varied_corpus(TENANTS, POSTS))
    caps = set_dollar_caps(engine, {"acme": "0.0005", "globex": "0.0003"})
    sim = start_sim(prompt_token_factor=3.0)
    reports = run_batch(engine, TENANTS, batch_options(sim, max_lines=25))
    assert_caps_held(engine, sim, reports, caps, POSTS)
    with engine.connect() as conn:
        # Every chunk was booked: nothing is still held.
        held = open_reserved(conn, "acme") + open_reserved(conn, "globex")
    assert usage_tiers(engine) == {"batch"} and held == Spend()
