"""The deadline planner: least cost by tier, rescued batches, the time a cancel takes, flex
only as far as standard could take it over, infeasible deadlines refused."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_assets.domain.money.deadline import (
    DeadlineError,
    Tier,
    Work,
    make_plan,
    parse_deadline,
)
from backfill_assets.domain.money.tier_split import Rates, SyncSplit, sync_split, tier_counts

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
    std: float = 10.0,
    flex: float = 0.0,
    unavailable: float = 0.0,
    batch_s: float = DAY,
    cancel_s: float = 0.0,
) -> Rates:
    return Rates(std, flex, unavailable, batch_s, cancel_s)


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


def test_flex_gets_only_the_keys_standard_could_still_take_over() -> None:
    # 10 min window x 0.9 = 540 s. Standard needs 300 s for all 3,000 keys, so flex may use
    # the other 240 s: 1/s x (1 - 0.5) x 240 = 120 keys. From 540 - 120/10 = 528 s on, a key
    # still unsent goes at standard: should flex stop answering, standard still ends in time.
    plan = make_plan(
        work(3000), rates(std=10, flex=1, unavailable=0.5), NOW, NOW + dt.timedelta(minutes=10)
    )
    assert plan.keys == {Tier.BATCH: 0, Tier.FLEX: 120, Tier.STANDARD: 2880}
    assert plan.feasible and plan.flex_until == NOW + dt.timedelta(seconds=528)
    # Flex answering as assumed is done by then: 120 / 0.5 + 2,880 / 10 = 528 s.
    assert plan.expected_finish == NOW + dt.timedelta(seconds=528)
    assert plan.cost == Decimal("0.0120") + Decimal("0.5760")


def test_the_split_of_the_issue_flex_for_what_the_window_spares() -> None:
    # 300 keys at 600 RPM with flex refusing 25%, a 60 s deadline: 54 s to use, standard
    # needs 30 s of it; flex finishes 7.5 keys/s in the other 24 s. So 180 keys at flex, the
    # other 120 at standard, and flex until 54 - 180/10 = 36 s.
    r = rates(std=10, flex=10, unavailable=0.25)
    assert sync_split(300, r, 54.0) == SyncSplit(180, 120, 36.0)
    plan = make_plan(work(150, 150), r, NOW, NOW + dt.timedelta(seconds=60))
    assert plan.keys == {Tier.BATCH: 0, Tier.FLEX: 180, Tier.STANDARD: 120}
    assert [p.keys[Tier.FLEX] for p in plan.tenants] == [90, 90]
    # Standard alone needs more than the window: no flex at all, nothing to switch.
    assert sync_split(600, r, 54.0) == SyncSplit(0, 600, None)
    # Twice the standard time and more: everything at flex (with no refusals).
    assert sync_split(300, rates(std=10, flex=10), 60.0) == SyncSplit(300, 0, 30.0)


@given(
    keys=st.integers(0, 100_000),
    std=st.floats(0.1, 1000),
    flex=st.floats(0, 1000),
    unavailable=st.floats(0, 1),
    usable=st.floats(0, 10 * DAY),
)
def test_flex_is_done_in_time_or_standard_takes_it_over_in_time(
    keys: int, std: float, flex: float, unavailable: float, usable: float
) -> None:
    r = rates(std=std, flex=flex, unavailable=unavailable)
    split = sync_split(keys, r, usable)
    assert split.flex + split.standard == keys and min(split.flex, split.standard) >= 0
    if split.flex == 0:
        assert split.flex_until_s is None
        return
    assert split.flex_until_s is not None
    slack = 1e-6 * max(1.0, usable)
    # Flex answering as assumed: its keys and standard's are done by the end of flex.
    assert split.flex / r.flex_effective_per_s + split.standard / std <= split.flex_until_s + slack
    # Flex stopping at any moment: standard takes every flex key left, in time.
    assert split.flex_until_s + split.flex / std <= usable + slack


def test_batch_is_used_only_as_far_as_a_stall_can_be_rescued() -> None:
    # Window 0.9 x 2 h = 6,480 s; batch due back in 6,000 s; 480 s left at 10/s rescue 4,800.
    plan = make_plan(work(6000), rates(batch_s=6000), NOW, NOW + dt.timedelta(hours=2))
    assert plan.keys == {Tier.BATCH: 4800, Tier.FLEX: 0, Tier.STANDARD: 1200}
    assert plan.switch_over == NOW + dt.timedelta(seconds=6000)
    assert plan.feasible and plan.reasons == ()


def test_the_switch_over_leaves_the_time_a_cancel_takes_before_the_rescue() -> None:
    # As above, but a cancel takes 100 s: the keys of a stalled batch are back 100 s after
    # the switch-over, so batch gets 380 s of rescue (3,800 keys) and the switch-over comes
    # at 6,480 - 100 - 380 = 6,000 s, still after the batch is due back.
    plan = make_plan(
        work(6000), rates(batch_s=6000, cancel_s=100), NOW, NOW + dt.timedelta(hours=2)
    )
    assert plan.keys == {Tier.BATCH: 3800, Tier.FLEX: 0, Tier.STANDARD: 2200}
    assert plan.switch_over == NOW + dt.timedelta(seconds=6000)
    # Without the cancel's time the switch-over would leave a stall's rescue 100 s short.
    blind = make_plan(work(6000), rates(batch_s=6000), NOW, NOW + dt.timedelta(hours=2))
    assert blind.keys[Tier.BATCH] == 4800 and blind.switch_over == plan.switch_over
    # A long deadline: everything still on batch, the switch-over the cancel time earlier.
    long = make_plan(work(5000), rates(cancel_s=600), NOW, NOW + dt.timedelta(days=3))
    assert long.keys[Tier.BATCH] == 5000
    assert long.switch_over == NOW + dt.timedelta(seconds=3 * DAY * 0.9 - 600 - 500)


def test_a_cancel_longer_than_the_room_after_the_batch_means_no_batch() -> None:
    # 2 h window 6,480 s; batch due in 6,000 s; cancels take 600 s: nothing could be rescued.
    plan = make_plan(
        work(6000), rates(batch_s=6000, cancel_s=600), NOW, NOW + dt.timedelta(hours=2)
    )
    assert plan.keys == {Tier.BATCH: 0, Tier.FLEX: 0, Tier.STANDARD: 6000}
    assert plan.switch_over is None


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
    r = Rates(std, flex, unavailable, batch_s, 0.0)
    plan = make_plan(work(*keys), r, NOW, NOW + dt.timedelta(hours=hours))
    for w, p in zip(work(*keys), plan.tenants, strict=True):
        assert sum(p.keys.values()) == w.keys and min(p.keys.values()) >= 0
    assert plan.cost_all_batch <= plan.cost <= plan.cost_all_standard
    if plan.feasible:
        assert plan.expected_finish <= plan.deadline


@given(
    total=st.integers(0, 100_000),
    window=st.floats(0, 10 * DAY),
    cancel=st.floats(0, 3600),
)
def test_tier_counts_add_up_and_rescue_a_stall_after_its_cancel(
    total: int, window: float, cancel: float
) -> None:
    r = rates(flex=3, unavailable=0.3, batch_s=DAY / 2, cancel_s=cancel)
    split = tier_counts(total, r, window)
    assert sum(split.keys.values()) == total and min(split.keys.values()) >= 0
    batch = split.keys[Tier.BATCH]
    if not batch:
        assert split.switch_s is None
        return
    assert split.switch_s is not None and split.switch_s >= 0
    if total <= math.floor(r.sync_per_s * (window - cancel)):
        # Hedged: after the batch is due back, and a stall rescued in time after its cancel.
        assert split.switch_s >= r.batch_completion_s - 1e-6
        assert split.switch_s + cancel + batch / r.sync_per_s <= window + 1e-6


def test_a_tenant_whose_token_budget_cannot_cover_its_keys_is_reported() -> None:
    w = [Work("big", 100, PRICES, bound_tokens=90_000, tokens_left=50_000), *work(5)]
    plan = make_plan(w, rates(), NOW, NOW + dt.timedelta(days=3))
    assert [p.over_budget for p in plan.tenants] == [True, False]
    assert "big: its keys reserve up to 90000 tokens" in plan.reasons[0]
