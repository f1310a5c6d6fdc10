"""The deadline planner: least cost by tier, rescued batches, infeasible deadlines refused."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_assets.core.deadline import (
    DeadlineError,
    Rates,
    Tier,
    Work,
    make_plan,
    parse_deadline,
    tier_counts,
)

NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
PRICES = {
    Tier.STANDARD: Decimal("0.0002"),
    Tier.FLEX: Decimal("0.0001"),
    Tier.BATCH: Decimal("0.0001"),
}
DAY = 86_400.0


def work(*keys: int, budget: Decimal | None = None) -> list[Work]:
    return [Work(f"t{i}", n, PRICES, budget) for i, n in enumerate(keys)]


def rates(
    std: float = 10.0, flex: float = 0.0, unavailable: float = 0.0, batch_s: float = DAY
) -> Rates:
    return Rates(std, flex, unavailable, batch_s)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("36h", NOW + dt.timedelta(hours=36)),
        ("1d12h", NOW + dt.timedelta(hours=36)),
        ("90m", NOW + dt.timedelta(minutes=90)),
        ("1.5h", NOW + dt.timedelta(minutes=90)),
        ("2026-12-04T09:00:00Z", dt.datetime(2026, 12, 4, 9, tzinfo=dt.UTC)),
        ("2026-12-04T09:00", dt.datetime(2026, 12, 4, 9, tzinfo=dt.UTC)),
        ("2026-12-04T10:00+01:00", dt.datetime(2026, 12, 4, 9, tzinfo=dt.UTC)),
    ],
)
def test_deadlines_read_as_iso_times_or_durations(text: str, expected: dt.datetime) -> None:
    assert parse_deadline(text, NOW) == expected


@pytest.mark.parametrize("text", ["", "friday", "36", "-3h", "2026-12-02T09:00Z", "0h"])
def test_unreadable_or_past_deadlines_are_refused(text: str) -> None:
    with pytest.raises(DeadlineError):
        parse_deadline(text, NOW)


def test_a_long_deadline_puts_everything_on_batch() -> None:
    plan = make_plan(work(3000, 2000), rates(), NOW, NOW + dt.timedelta(days=3))
    assert plan.feasible and plan.keys == {Tier.BATCH: 5000, Tier.FLEX: 0, Tier.STANDARD: 0}
    assert plan.cost == plan.cost_all_batch == Decimal("0.5000")
    assert plan.cost_all_standard == Decimal("1.0000")
    # Due back after a day; if it stalls, 5,000 keys at 10/s need 500 s before the end.
    window = 3 * DAY * 0.9
    assert plan.switch_over == NOW + dt.timedelta(seconds=window - 500)
    assert plan.expected_finish == NOW + dt.timedelta(seconds=DAY)
    assert plan.reasons == ()


def test_a_deadline_shorter_than_any_batch_uses_flex_then_standard() -> None:
    # 2 h: no batch (a day). Flex finishes 5/s x 0.8 = 4/s, 25,920 keys in 1.8 h: all of 5,000.
    plan = make_plan(work(5000), rates(flex=5, unavailable=0.2), NOW, NOW + dt.timedelta(hours=2))
    assert plan.keys == {Tier.BATCH: 0, Tier.FLEX: 5000, Tier.STANDARD: 0}
    assert plan.switch_over is None and plan.feasible


def test_flex_unavailability_moves_keys_to_standard_in_time() -> None:
    # 10 min window x 0.9 = 540 s: flex finishes 1/s x (1 - 0.5) = 270; the rest go standard.
    plan = make_plan(
        work(3000), rates(std=10, flex=1, unavailable=0.5), NOW, NOW + dt.timedelta(minutes=10)
    )
    assert plan.keys == {Tier.BATCH: 0, Tier.FLEX: 270, Tier.STANDARD: 2730}
    assert plan.feasible
    assert plan.expected_finish <= NOW + dt.timedelta(minutes=9)
    assert plan.cost == Decimal("0.0270") + Decimal("0.5460")


def test_batch_is_used_only_as_far_as_a_stall_can_be_rescued() -> None:
    # Window 0.9 x 2 h = 6,480 s; batch due back in 6,000 s; 480 s left at 10/s rescue 4,800.
    plan = make_plan(work(6000), rates(batch_s=6000), NOW, NOW + dt.timedelta(hours=2))
    assert plan.keys == {Tier.BATCH: 4800, Tier.FLEX: 0, Tier.STANDARD: 1200}
    assert plan.switch_over == NOW + dt.timedelta(seconds=6000)
    assert plan.feasible and plan.reasons == ()


def test_an_impossible_deadline_is_infeasible_with_a_reason() -> None:
    plan = make_plan(work(100_000), rates(std=10), NOW, NOW + dt.timedelta(hours=1))
    assert not plan.feasible
    assert "100000 key(s) need 2.8 h" in plan.reasons[0]


def test_the_margin_gives_way_before_the_deadline_does() -> None:
    # 1,000 s at 10/s: 100 s; the deadline is 105 s away, the margin would leave 94.5 s.
    plan = make_plan(work(1000), rates(std=10), NOW, NOW + dt.timedelta(seconds=105))
    assert plan.feasible and "margin" in plan.reasons[0]


def test_keys_beyond_the_synchronous_capacity_rely_on_batch_and_say_so() -> None:
    plan = make_plan(work(1_000_000), rates(std=1, batch_s=3600), NOW, NOW + dt.timedelta(days=1))
    assert plan.feasible and plan.keys[Tier.BATCH] > 900_000
    assert any("rely on it" in r for r in plan.reasons)


def test_a_tenant_whose_budget_cannot_cover_its_keys_is_reported() -> None:
    plan = make_plan(work(1000, budget=Decimal("0.05")), rates(), NOW, NOW + dt.timedelta(days=3))
    assert plan.tenants[0].over_budget
    assert "t0: planned $0.1000 exceeds its budget left $0.05" in plan.reasons[0]


def test_as_dict_carries_money_as_strings() -> None:
    doc = make_plan(work(10), rates(), NOW, NOW + dt.timedelta(days=3)).as_dict()
    assert doc["cost_usd"] == "0.0010" and doc["keys"] == {"batch": 10, "flex": 0, "standard": 0}
    assert doc["tenants"][0]["keys"]["batch"] == 10


@given(
    keys=st.lists(st.integers(0, 5000), min_size=1, max_size=6),
    std=st.floats(0.1, 100),
    flex=st.floats(0, 100),
    unavailable=st.floats(0, 1),
    batch_s=st.floats(0, 3 * DAY),
    hours=st.floats(0.01, 100),
)
def test_every_key_is_planned_exactly_once(
    keys: list[int], std: float, flex: float, unavailable: float, batch_s: float, hours: float
) -> None:
    r = Rates(std, flex, unavailable, batch_s)
    plan = make_plan(work(*keys), r, NOW, NOW + dt.timedelta(hours=hours))
    for w, p in zip(work(*keys), plan.tenants, strict=True):
        assert sum(p.keys.values()) == w.keys and min(p.keys.values()) >= 0
    assert plan.cost_all_batch <= plan.cost <= plan.cost_all_standard
    if plan.feasible:
        assert plan.expected_finish <= plan.deadline


@given(total=st.integers(0, 100_000), window=st.floats(0, 10 * DAY))
def test_tier_counts_add_up(total: int, window: float) -> None:
    counts, rescue_s = tier_counts(total, rates(flex=3, unavailable=0.3, batch_s=DAY / 2), window)
    assert sum(counts.values()) == total and rescue_s >= 0


def test_a_tenant_whose_token_budget_cannot_cover_its_keys_is_reported() -> None:
    w = [Work("big", 100, PRICES, bound_tokens=90_000, tokens_left=50_000), *work(5)]
    plan = make_plan(w, rates(), NOW, NOW + dt.timedelta(days=3))
    assert [p.over_budget for p in plan.tenants] == [True, False]
    assert "big: its keys reserve up to 90000 tokens" in plan.reasons[0]
