"""A model with no price, run on purpose (BACKFILL_ALLOW_UNPRICED): its calls book cost
*unknown*, not $0, and every report says so."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import main
from backfill_assets.domain.policy.rubric import TASK_VERSION
from backfill_assets.domain.work.keys import Versions
from backfill_tests.conftest import import_records
from backfill_tests.providers.conftest import RUBRIC, StartSim, run_over_http

UNPRICED = "my-llama-3"


def test_an_unpriced_model_books_cost_unknown_and_reports_say_so(
    engine: Engine,
    cli_store: dict[str, str],
    tmp_path: Path,
    start_sim: StartSim,
    capsys: pytest.CaptureFixture[str],
) -> None:
    posts = [{"tenant_id": "acme", "post_id": f"p{i}", "text": f"hi {i}"} for i in range(6)]
    import_records(engine, tmp_path, posts)
    sim = start_sim(models=(UNPRICED,))
    versions = Versions(TASK_VERSION, RUBRIC.key_version, UNPRICED)
    reports = run_over_http(engine, sim, ["acme"], versions=versions)
    with engine.connect() as conn:
        events = conn.execute(
            sa.text(
                "SELECT cost_unknown, cost_nanos, price_booked FROM ledger_events"
                " WHERE type = 'usage'"
            )
        ).all()
    assert len(events) == 6 and all(e == (1, 0, None) for e in events)
    ran = [r for r in reports if r.stats.calls]
    assert sum(r.stats.calls_cost_unknown for r in ran) == 6
    assert all(r.summary()["cost_usd"].startswith("unknown (") for r in ran)

    assert main(["usage", "--totals", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["usage"]
    assert row["cost_usd"] == "unknown (6 calls unpriced)" and row["calls_cost_unknown"] == 6
    assert main(["usage", "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["cost_usd"] for r in rows] == ["unknown", "unknown"]  # the day, and the TOTAL
    assert main(["usage"]) == 0
    assert "unknown (6 calls unpriced)" in capsys.readouterr().out
