"""Dated prices: a call is priced at the entry in force on its day, an event keeps the price it
was booked at when the table changes, and ``usage --reprice`` shows both side by side."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import main
from backfill_assets.config.settings import Settings, SettingsError
from backfill_assets.domain.money.prices import PriceError, PriceTable, Tier
from backfill_assets.providersim import Simulator
from backfill_tests.conftest import import_records
from backfill_tests.providers.conftest import MODEL, StartSim, run_over_http

TODAY = dt.datetime.now(dt.UTC).date()
OLD = {"from": "2020-01-01", "standard": {"input": 1, "output": 2}}
NEW = {"from": TODAY.isoformat(), "standard": {"input": 3, "output": 6}}


def test_the_entry_in_force_on_the_day_prices_the_call() -> None:
    table = PriceTable.from_json(json.dumps({"m": [NEW, OLD]}))  # any order
    assert table.cost("m", 1000, 0, day=dt.date(2021, 5, 1)) == 1_000_000
    assert table.cost("m", 1000, 0, day=TODAY) == 3_000_000
    assert table.cost("m", 1000, 0, day=dt.date(2019, 1, 1)) == 1_000_000  # before the first
    booked = table.booked("m", Tier.FLEX, dt.date(2021, 5, 1))
    assert booked is not None and booked.since == dt.date(2020, 1, 1)
    assert json.loads(booked.to_json()) == {
        "model": "m",
        "tier": "flex",
        "from": "2020-01-01",
        "input": "0.5",
        "output": "1.0",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"m": []}', "empty list"),
        (json.dumps({"m": [OLD, OLD]}), "two prices from the same day"),
        ('{"m": [{"from": "someday", "standard": {"input": 1, "output": 1}}]}', "'m': from"),
        ('{"m": [{"standard": {"input": 1, "output": 1}, "gold": {}}]}', "'m': gold"),
        ('{"m": {"input": -1, "output": 1}}', "'m': input"),
    ],
)
def test_a_bad_dated_table_is_refused_naming_the_model(text: str, message: str) -> None:
    with pytest.raises(PriceError, match=message):
        PriceTable.from_json(text)


def _run(engine: Engine, sim: Simulator, prices: dict[str, Any], tenant: str) -> None:
    run_over_http(engine, sim, [tenant], prices=PriceTable.from_json(json.dumps(prices)))


def _booked(engine: Engine, tenant: str) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT cost_nanos, price_booked FROM ledger_events"
                " WHERE type = 'usage' AND tenant_id = :t ORDER BY id"
            ),
            {"t": tenant},
        ).all()
    return [(int(c), str(p)) for c, p in rows]


def test_a_price_change_never_rewrites_what_was_booked(
    engine: Engine,
    cli_store: dict[str, str],
    tmp_path: Path,
    start_sim: StartSim,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    posts = [
        {"tenant_id": t, "post_id": f"p{i}", "text": f"post {i} of {t}"}
        for t in ("acme", "globex")
        for i in range(8)
    ]
    import_records(engine, tmp_path, posts)
    sim = start_sim()
    _run(engine, sim, {MODEL: [OLD]}, "acme")
    before = _booked(engine, "acme")
    assert before and all(json.loads(p)["from"] == "2020-01-01" for _, p in before)
    # The table changes from today on; globex is sent under it, acme's events stay as booked.
    _run(engine, sim, {MODEL: [OLD, NEW]}, "globex")
    assert _booked(engine, "acme") == before
    after = _booked(engine, "globex")
    assert all(json.loads(p)["from"] == TODAY.isoformat() for _, p in after)

    monkeypatch.setenv("BACKFILL_PRICES", json.dumps({MODEL: [OLD, NEW]}))
    assert main(["usage", "--reprice", "--json"]) == 0
    rows = {r["tenant"]: r for r in json.loads(capsys.readouterr().out)["usage"]}
    acme_booked = sum(c for c, _ in before)
    assert Decimal(rows["acme"]["booked_usd"]) * 10**9 == acme_booked
    assert Decimal(rows["acme"]["today_usd"]) * 10**9 == 3 * acme_booked  # 3x the old price
    assert rows["globex"]["today_usd"] == rows["globex"]["booked_usd"]
    assert rows["globex"]["difference_usd"] == "0.000000000"


def test_the_price_table_can_live_in_a_file(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"my-model": [OLD, NEW]}))
    env = {"BACKFILL_MODEL_BACKEND": "openai", "BACKFILL_MODEL": "my-model"}
    settings = Settings.from_env({**env, "BACKFILL_PRICES_PATH": str(path)})
    assert settings.model.prices().cost("my-model", 1000, 0) == 3_000_000  # NEW is in force today
    both = {**env, "BACKFILL_PRICES_PATH": str(path), "BACKFILL_PRICES": "{}"}
    with pytest.raises(SettingsError, match="not both"):
        Settings.from_env(both)
    with pytest.raises(SettingsError, match="cannot read"):
        Settings.from_env({"BACKFILL_PRICES_PATH": str(tmp_path / "missing.json")})
    path.write_text('{"my-model": {"input": "lots"}}')
    with pytest.raises(SettingsError, match=r"prices.json: unreadable price table: 'my-model'"):
        Settings.from_env({"BACKFILL_PRICES_PATH": str(path)})
