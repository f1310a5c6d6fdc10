"""The arithmetic of budgets in tokens and dollars: what a grant gives in each unit, that a
call's reserved dollar bound covers any bill it can produce, and how a dollar cap is typed."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_assets.domain.money.budgets import Caps, Reservation, Spend, grant_spend, over_bound
from backfill_assets.domain.money.nanos import nanos_of_usd
from backfill_assets.domain.money.prices import Price, PriceTable, Tier


@pytest.mark.parametrize(
    ("caps", "want", "minimum", "free", "granted"),
    [
        # No cap in a unit: what was asked, whatever is "free" there.
        (Caps(), Spend(100, 900), Spend(10, 90), Spend(0, 0), Spend(100, 900)),
        # A dollar cap: at most half of what is free, never less than the call needs.
        (Caps(nanos=1000), Spend(100, 900), Spend(10, 90), Spend(0, 1000), Spend(100, 500)),
        (Caps(nanos=1000), Spend(100, 900), Spend(10, 600), Spend(0, 1000), Spend(100, 600)),
        # Either capped unit short: nothing at all.
        (Caps(nanos=1000), Spend(100, 900), Spend(10, 90), Spend(0, 50), None),
        (Caps(tokens=5, nanos=1000), Spend(100, 900), Spend(10, 90), Spend(5, 1000), None),
        (
            Caps(tokens=50, nanos=1000),
            Spend(100, 900),
            Spend(10, 90),
            Spend(50, 1000),
            Spend(25, 500),
        ),
    ],
)
def test_a_grant_is_limited_by_every_capped_unit(
    caps: Caps, want: Spend, minimum: Spend, free: Spend, granted: Spend | None
) -> None:
    assert grant_spend(want, minimum, free, caps) == granted


prices = st.builds(
    Price,
    input=st.decimals(min_value=0, max_value=100, places=3),
    output=st.decimals(min_value=0, max_value=100, places=3),
    cached_input=st.none() | st.decimals(min_value=0, max_value=100, places=3),
    cache_write=st.none() | st.decimals(min_value=0, max_value=100, places=3),
)


@given(
    price=prices,
    prompt=st.integers(0, 200_000),
    output=st.integers(0, 4_096),
    cached_share=st.floats(0, 1),
    written_share=st.floats(0, 1),
    used_output=st.floats(0, 1),
)
def test_the_dollar_bound_covers_every_bill_within_the_token_bound(
    price: Price,
    prompt: int,
    output: int,
    cached_share: float,
    written_share: float,
    used_output: float,
) -> None:
    cached = int(prompt * cached_share)
    written = int((prompt - cached) * written_share)
    bill = price.cost(prompt, int(output * used_output), cached, written)
    assert bill <= price.bound(prompt, output)


def test_a_flex_call_reserves_the_standard_price_it_may_be_booked_at() -> None:
    table = PriceTable.from_json("")
    standard = table.cost_bound("gpt-4o-mini", [Tier.STANDARD], 1000, 64)
    flex = table.cost_bound("gpt-4o-mini", [Tier.FLEX], 1000, 64)
    both = table.cost_bound("gpt-4o-mini", [Tier.FLEX, Tier.STANDARD], 1000, 64)
    assert standard is not None and flex is not None
    assert both == standard == 2 * flex  # 1000 x $0.15 + 64 x $0.60 per million
    assert standard == 1000 * 150 + 64 * 600
    assert table.cost_bound("no-such-model", [Tier.STANDARD], 1000, 64) is None


def test_a_bill_past_either_bound_is_over_it() -> None:
    reserved = Reservation("acme", "r", Spend(100, 1_000))
    assert over_bound(Spend(100, 1_000), reserved) == ""
    assert "billed 101 > reserved bound 100" in over_bound(Spend(101, 10), reserved)
    assert "1001 nano-dollars" in over_bound(Spend(50, 1_001), reserved)
    # Unpriced: no dollar bound was reserved, so none can be passed.
    unpriced = Reservation("acme", "r", Spend(100, 0), priced=False)
    assert over_bound(Spend(100, 5), unpriced) == ""


@pytest.mark.parametrize(
    ("typed", "nanos"),
    [
        ("50", 50_000_000_000),
        ("12.50", 12_500_000_000),
        ("$0.000000001", 1),
        ("1_000", 1_000_000_000_000),
        ("0", 0),
    ],
)
def test_a_dollar_cap_is_typed_in_dollars_and_kept_in_nanos(typed: str, nanos: int) -> None:
    assert nanos_of_usd(typed) == nanos
    assert Decimal(nanos) / 10**9 == Decimal(typed.lstrip("$").replace("_", ""))


@pytest.mark.parametrize(
    ("typed", "reason"),
    [
        ("-1", "at least 0"),
        ("0.0000000001", "finer than a nano-dollar"),
        ("NaN", "finite"),
        ("inf", "finite"),
        ("fifty", "not a dollar amount"),
        ("", "not a dollar amount"),
    ],
)
def test_a_bad_dollar_cap_is_refused_with_its_reason(typed: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        nanos_of_usd(typed)
