"""Money is integer nano-dollars: exact per call, and a sum over many calls is the same in any
order and equals the price of the whole (up to one rounding per call)."""

from __future__ import annotations

import csv
import io
import random
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_assets.config.settings import Settings, SettingsError
from backfill_assets.defs.reporting.usage import usage_csv
from backfill_assets.domain.money.nanos import usd, usd_rounded, usd_text, whole_nanos
from backfill_assets.domain.money.prices import PriceTable, Tier

TABLE = PriceTable.from_json(
    '{"m": {"input": 0.15, "output": 0.6}, "odd": {"input": 0.0375, "output": 0.3}}'
)


def test_a_call_costs_whole_nano_dollars() -> None:
    assert TABLE.cost("m", 1000, 100) == 150 * 1000 + 600 * 100
    assert TABLE.cost("odd", 1, 0) == 38  # 37.5 rounds half to even
    assert TABLE.cost("odd", 3, 0) == 112  # 112.5 -> 112
    assert TABLE.cost("m", 1000, 100, tier=Tier.BATCH) == 105_000  # batch: half, rounded once


def test_prices_are_read_as_decimals_not_floats() -> None:
    price = PriceTable.from_json('{"x": {"input": 0.1, "output": 0.2}}').price_for("x")
    assert price is not None and price.input == Decimal("0.1") and price.output == Decimal("0.2")


@given(
    st.lists(st.tuples(st.integers(0, 200_000), st.integers(0, 4_000)), min_size=1, max_size=300)
)
def test_a_sum_is_the_same_in_any_order(calls: list[tuple[int, int]]) -> None:
    costs = [TABLE.cost("m", i, o) for i, o in calls]
    shuffled = costs[:]
    random.Random(7).shuffle(shuffled)
    assert sum(costs) == sum(shuffled) == sum(reversed(costs))
    # Prices of whole nanos per token: the sum is the price of all the tokens at once.
    assert sum(costs) == TABLE.cost("m", sum(i for i, _ in calls), sum(o for _, o in calls))


def test_dollars_are_shown_exactly() -> None:
    assert usd(33_374_000) == Decimal("0.033374000")
    assert usd_text(1) == "0.000000001"
    assert usd_text(10**18) == "1000000000.000000000"
    assert whole_nanos(Decimal("2.5")) == 2 and whole_nanos(Decimal("3.5")) == 4


def test_an_unpriced_model_of_a_real_provider_is_refused_unless_allowed() -> None:
    env = {"BACKFILL_MODEL_BACKEND": "openai", "BACKFILL_MODEL": "my-llama"}
    # Asked by what prices or sends (cli/test_priced_commands.py), not by reading the settings.
    with pytest.raises(SettingsError, match="BACKFILL_MODEL 'my-llama' has no price"):
        Settings.from_env(env, load_policy=False).require_price()
    Settings.from_env({**env, "BACKFILL_ALLOW_UNPRICED": "1"}, load_policy=False).require_price()
    priced = '{"my-llama": {"input": 0.02, "output": 0.02}}'
    settings = Settings.from_env({**env, "BACKFILL_PRICES": priced}, load_policy=False)
    settings.require_price()
    assert settings.model.prices().cost("my-llama", 1_000_000, 0) == 20_000_000
    # The fake model bills no one: no price needed.
    Settings.from_env({"BACKFILL_MODEL": "fake-moderator-2"}, load_policy=False).require_price()


def test_the_invoice_csv_rounds_rows_to_6_places_and_totals_once_to_the_cent() -> None:
    rows = [
        {
            "tenant": "acme",
            "model": "m",
            "day": "2026-12-01",
            "calls": 1,
            "tokens_in": 10,
            "tokens_out": 1,
            "tokens_cached": 0,
            "tokens": 11,
            "cost_nanos": 4_999_999,
        },
        {
            "tenant": "acme",
            "model": "m",
            "day": "2026-12-02",
            "calls": 1,
            "tokens_in": 10,
            "tokens_out": 1,
            "tokens_cached": 5,
            "tokens": 11,
            "cost_nanos": 500,
        },
        {
            "tenant": "globex",
            "model": "m",
            "day": "2026-12-01",
            "calls": 2,
            "tokens_in": 4,
            "tokens_out": 2,
            "tokens_cached": 0,
            "tokens": 6,
            "cost_nanos": 5_000_000,
        },
    ]
    out = list(csv.DictReader(io.StringIO(usage_csv(rows))))
    assert [r["cost_usd"] for r in out[:3]] == ["0.005000", "0.000001", "0.005000"]
    assert [r["cost_nanos"] for r in out[:3]] == ["4999999", "500", "5000000"]
    totals = {r["tenant"]: r for r in out[3:]}
    assert all(r["model"] == "TOTAL" for r in totals.values())
    # acme's exact total, $0.005000499, rounded once, half up; alone, its first row would be 0.00.
    assert totals["acme"]["cost_usd"] == "0.01" and totals["acme"]["calls"] == "2"
    assert totals["acme"]["cached_share"] == "0.2500"
    assert totals["globex"]["cost_usd"] == "0.01"
    assert usd_rounded(4_999_999, 2) == Decimal("0.00")
