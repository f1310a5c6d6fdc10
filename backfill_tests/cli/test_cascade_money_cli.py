"""A cascade's money through the CLI against the simulator, on both stores: dollar caps hold at
64 calls in flight while the provider bills three times the prompt tokens, and each tenant's
cost per stage equals the simulator's meter to the nano-dollar, in the ledger and in what
``usage`` and its CSV (the invoice) show per stage."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import main
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import varied_corpus
from backfill_tests.providers.conftest import StartSim

POLICY = Path(__file__).resolve().parents[2] / "docs" / "policies" / "forum-moderation.yaml"
TENANTS = ["acme", "globex", "initech"]
CAPS = {"acme": Decimal("0.004"), "globex": Decimal("0.002")}
# The screen decides almost nothing (a none label's confidence is one minus the highest
# category score, below 1), so nearly every post would reach the judge: the caps must stop it.
CASCADE = """\
stages:
  - name: screen
    dialect: openai-moderation
    model: omni-moderation-latest
    decide: {when: none_label, min_score: 1.0}
  - name: judge
    dialect: chat-json
    model: gpt-4o-mini
"""
STAGE_OF = {"omni-moderation-latest": "screen", "gpt-4o-mini": "judge"}


def _booked(engine: Engine) -> dict[tuple[str, str], int]:
    """Per (tenant, model): the nano-dollars its usage events booked."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT tenant_id, model, coalesce(sum(cost_nanos), 0) FROM ledger_events "
                "WHERE type = 'usage' GROUP BY tenant_id, model"
            )
        ).all()
    return {(str(t), str(m)): int(c) for t, m, c in rows}


def _metered(engine: Engine, sim: Any) -> dict[tuple[str, str], int]:
    """Per (tenant, model): what the simulator billed, its calls traced to their tenants
    through the keys the ledger announced (each key is one tenant's post)."""
    with engine.connect() as conn:
        owner = dict(
            conn.execute(
                sa.text("SELECT DISTINCT key, tenant_id FROM ledger_events WHERE type = 'attempt'")
            ).all()
        )
    out: dict[tuple[str, str], int] = defaultdict(int)
    for call in sim.meter.snapshot().billed.values():
        if call.cost_nanos:
            out[(str(owner[call.correlation_id]), str(call.model))] += int(call.cost_nanos)
    return dict(out)


def test_caps_hold_at_64_in_flight_under_3x_billing_and_stage_costs_equal_the_meter(
    engine: Engine,
    tmp_path: Path,
    cli_store: dict[str, str],
    start_sim: StartSim,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import_records(engine, tmp_path, varied_corpus(TENANTS, 60))
    sim = start_sim(prompt_token_factor=3.0, latency_median_ms=20)
    cascade = tmp_path / "cascade.yaml"
    cascade.write_text(CASCADE, encoding="utf-8")
    for name, value in {
        "BACKFILL_MODEL_BACKEND": "openai",
        "BACKFILL_POLICY_PATH": str(POLICY),
        "BACKFILL_CASCADE_PATH": str(cascade),
        "BACKFILL_MODEL_BASE_URL": sim.base_url,
        "BACKFILL_CONCURRENCY": "64",
    }.items():
        monkeypatch.setenv(name, value)
    for tenant, cap in CAPS.items():
        assert main(["tenant", "set-budget", tenant, "--usd", str(cap)]) == 0
    main(["run"])
    booked = _booked(engine)
    # Caps hold over every stage's calls, whatever the provider billed.
    for tenant, cap in CAPS.items():
        spent = sum(c for (t, _m), c in booked.items() if t == tenant)
        assert 0 < spent <= int(cap * 10**9), (tenant, spent)
    # The capped tenants stopped short; the uncapped one went all the way.
    with engine.connect() as conn:
        decided = dict(
            conn.execute(
                sa.text(
                    "SELECT tenant_id, count(*) FROM results WHERE model = 'cascade' "
                    "GROUP BY tenant_id"
                )
            ).all()
        )
    assert decided.get("initech") == 60
    assert all(decided.get(t, 0) < 60 for t in CAPS)
    # Every tenant's cost per stage is the simulator's bill for its calls, to the nano-dollar
    # (the screen is free: it books 0 as the meter does).
    assert booked[("initech", "omni-moderation-latest")] == 0
    assert {k: v for k, v in booked.items() if v} == _metered(engine, sim)
    # `usage` and its CSV (the invoice) name each row's stage, and their cost per tenant and
    # stage is the meter's too.
    metered = {(t, STAGE_OF[m]): c for (t, m), c in _metered(engine, sim).items()}
    capsys.readouterr()
    assert main(["usage", "--totals", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["usage"]
    assert {r["stage"] for r in rows} == {"screen", "judge"}
    assert all(r["stage"] == STAGE_OF[r["model"]] for r in rows)
    assert {(r["tenant"], r["stage"]): r["cost_nanos"] for r in rows if r["cost_nanos"]} == metered
    assert main(["usage", "--csv"]) == 0
    invoice: dict[tuple[str, str], int] = defaultdict(int)
    for r in csv.DictReader(io.StringIO(capsys.readouterr().out)):
        if r["model"] != "TOTAL":
            invoice[(r["tenant"], r["stage"])] += int(r["cost_nanos"])
    assert {k: v for k, v in invoice.items() if v} == metered
    assert invoice[("initech", "screen")] == 0
