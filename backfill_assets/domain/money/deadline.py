"""A deadline plan: which keys go to batch, flex and standard so the backfill ends in time.

Pure arithmetic; the caller measures the inputs (limiter rates, the store's batch and cancel
history, prices) and executes the plan. The plan is robust rather than hopeful: a key is put
on batch only if, should every batch stall, the synchronous tiers can still finish it between
the end of the cancels asked at the switch-over and the deadline less its margin; a key is put
on flex only if standard could still take it should flex stop answering. So a stalled batch
or a flex outage costs money (the standard price for what they did not do), never the
deadline. The split between tiers is ``tier_split.py``'s one rule: the run that carries the
plan out uses the same functions, so the plan prices what the run pays.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from backfill_assets.domain.money.prices import Tier
from backfill_assets.domain.money.tier_split import Rates, tier_counts


class DeadlineError(ValueError):
    """A deadline that cannot be read, or that lies in the past."""


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
_UNIT_S = {"d": 86_400.0, "h": 3_600.0, "m": 60.0, "s": 1.0}


def parse_deadline(text: str, now: dt.datetime) -> dt.datetime:
    """An ISO 8601 time (naive means UTC) or a duration from ``now`` such as ``36h``, ``1d12h``
    or ``90m``. The result is timezone-aware UTC and later than ``now``."""
    raw = text.strip()
    if not raw:
        raise DeadlineError(
            "empty deadline: give an ISO time (2026-12-04T09:00Z) or a duration (36h)"
        )
    when: dt.datetime | None = None
    compact = raw.lower().replace(" ", "")
    if re.fullmatch(r"(?:\d+(?:\.\d+)?[dhms])+", compact):
        seconds = sum(float(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(compact))
        when = now + dt.timedelta(seconds=seconds)
    else:
        try:
            when = dt.datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise DeadlineError(
                f"unreadable deadline {raw[:40]!r}: give an ISO time (2026-12-04T09:00Z) "
                "or a duration (36h, 1d12h, 90m)"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
    when = when.astimezone(dt.UTC)
    if when <= now:
        raise DeadlineError(f"deadline {when.isoformat()} is not after now ({now.isoformat()})")
    return when


@dataclass(frozen=True, slots=True)
class Work:
    """One tenant's pending keys and what one key is expected to cost on each tier."""

    tenant: str
    keys: int
    cost_per_key: Mapping[Tier, Decimal]
    # Dollars the tenant may still spend (None: no dollar budget).
    budget_left: Decimal | None = None
    # Tokens a strict token budget reserves for these keys, and what it has left (None: no cap).
    bound_tokens: int = 0
    tokens_left: int | None = None

    def cost(self, tier: Tier, keys: int) -> Decimal:
        return self.cost_per_key[tier] * keys


@dataclass(frozen=True, slots=True)
class TenantPlan:
    """One tenant's share of the plan."""

    tenant: str
    keys: Mapping[Tier, int]
    cost: Decimal
    budget_left: Decimal | None
    bound_tokens: int = 0
    tokens_left: int | None = None

    @property
    def over_budget(self) -> bool:
        """The budget stops this tenant before its keys are done, whatever the tiers."""
        return self.over_dollars or self.over_tokens

    @property
    def over_dollars(self) -> bool:
        return self.budget_left is not None and self.cost > self.budget_left

    @property
    def over_tokens(self) -> bool:
        return self.tokens_left is not None and self.bound_tokens > self.tokens_left


@dataclass(frozen=True, slots=True)
class DeadlinePlan:
    """The least expected cost that meets the deadline, and the figures an operator reads."""

    now: dt.datetime
    deadline: dt.datetime
    margin: float
    rates: Rates
    tenants: Sequence[TenantPlan]
    expected_finish: dt.datetime
    # The moment by which keys still waiting on batch must go to a synchronous tier.
    switch_over: dt.datetime | None
    # The moment from which every synchronous key still unsent goes at standard.
    flex_until: dt.datetime | None
    feasible: bool
    cost_all_standard: Decimal
    cost_all_batch: Decimal
    reasons: Sequence[str] = field(default_factory=tuple)

    @property
    def keys(self) -> dict[Tier, int]:
        return {t: sum(p.keys.get(t, 0) for p in self.tenants) for t in Tier}

    @property
    def cost(self) -> Decimal:
        return sum((p.cost for p in self.tenants), Decimal(0))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (money as strings, times as ISO 8601)."""
        return {
            "now": self.now.isoformat(),
            "deadline": self.deadline.isoformat(),
            "margin": self.margin,
            "feasible": self.feasible,
            "reasons": list(self.reasons),
            "keys": {t.value: n for t, n in self.keys.items()},
            "cost_usd": str(self.cost),
            "cost_all_standard_usd": str(self.cost_all_standard),
            "cost_all_batch_usd": str(self.cost_all_batch),
            "expected_finish": self.expected_finish.isoformat(),
            "switch_over": self.switch_over.isoformat() if self.switch_over else None,
            "flex_until": self.flex_until.isoformat() if self.flex_until else None,
            "rates": {
                "standard_per_s": self.rates.standard_per_s,
                "flex_per_s": self.rates.flex_per_s,
                "flex_unavailable": self.rates.flex_unavailable,
                "batch_completion_s": (
                    self.rates.batch_completion_s if self.rates.has_batch else None
                ),
                "batch_cancel_s": self.rates.batch_cancel_s,
            },
            "tenants": [
                {
                    "tenant": p.tenant,
                    "keys": {t.value: p.keys.get(t, 0) for t in Tier},
                    "cost_usd": str(p.cost),
                    "budget_left_usd": None if p.budget_left is None else str(p.budget_left),
                    "bound_tokens": p.bound_tokens,
                    "tokens_left": p.tokens_left,
                    "over_budget": p.over_budget,
                }
                for p in self.tenants
            ],
        }


def _spread(counts: Mapping[Tier, int], work: Sequence[Work]) -> list[dict[Tier, int]]:
    """Split the tier counts over tenants in proportion to their keys (largest remainder),
    cheapest tier first, so each tenant's counts add up to its keys exactly."""
    left = [w.keys for w in work]
    shares: list[dict[Tier, int]] = [{t: 0 for t in Tier} for _ in work]
    for tier in Tier:
        want = counts.get(tier, 0)
        pool = sum(left)
        if want <= 0 or pool <= 0:
            continue
        exact = [Decimal(n) * want / pool for n in left]
        got = [min(int(x), n) for x, n in zip(exact, left, strict=True)]
        short = want - sum(got)
        order = sorted(range(len(work)), key=lambda i: (-(exact[i] - int(exact[i])), i))
        for i in order:
            if short <= 0:
                break
            if got[i] < left[i]:
                got[i] += 1
                short -= 1
        for i, n in enumerate(got):
            shares[i][tier] = n
            left[i] -= n
    return shares


def make_plan(
    work: Sequence[Work],
    rates: Rates,
    now: dt.datetime,
    deadline: dt.datetime,
    margin: float = 0.10,
) -> DeadlinePlan:
    """The least expected cost plan that finishes ``work`` by ``deadline`` less ``margin`` of
    the time left. Infeasible when even everything on standard at the full rate misses the
    deadline itself (the margin is a preference, the deadline is not)."""
    if not (0.0 <= margin < 1.0):
        raise ValueError(f"margin must be within [0, 1), got {margin!r}")
    left_s = (deadline - now).total_seconds()
    window_s = left_s * (1.0 - margin)
    total = sum(w.keys for w in work)
    reasons: list[str] = []
    feasible = True
    split = tier_counts(total, rates, window_s)
    finish_s = _finish_seconds(split.keys, rates)
    if finish_s > window_s:
        # The margin is a preference, the deadline is not: try without it.
        split = tier_counts(total, rates, left_s)
        finish_s = _finish_seconds(split.keys, rates)
        if finish_s <= left_s:
            window_s = left_s
            reasons.append(f"the plan eats into the {margin:.0%} margin")
        else:
            feasible = False
            sync_s = total / rates.sync_per_s if rates.sync_per_s else math.inf
            batch_text = (
                f"batch is assumed to take {_human(rates.batch_completion_s)}"
                if rates.has_batch
                else "there is no batch tier"
            )
            reasons.append(
                f"{total} key(s) need {_human(sync_s)} on the synchronous tiers at"
                f" {rates.sync_per_s:.2f} keys/s and {batch_text};"
                f" the deadline is {_human(left_s)} away"
            )
    counts = split.keys
    batch = counts[Tier.BATCH]
    hedged_s = batch / rates.sync_per_s if rates.sync_per_s > 0 else math.inf
    if feasible and batch and window_s - rates.batch_cancel_s - hedged_s < rates.batch_completion_s:
        reasons.append(
            f"{batch} key(s) on batch rely on it finishing within "
            f"{_human(rates.batch_completion_s)}: the synchronous tiers could not take them all"
        )
    tenants: list[TenantPlan] = []
    for w, share in zip(work, _spread(counts, work), strict=True):
        cost = sum((w.cost(t, n) for t, n in share.items()), Decimal(0))
        tenants.append(
            TenantPlan(w.tenant, share, cost, w.budget_left, w.bound_tokens, w.tokens_left)
        )
    for p in tenants:
        if p.over_dollars:
            reasons.append(
                f"tenant {p.tenant}: planned ${p.cost} exceeds its budget left ${p.budget_left}"
            )
        if p.over_tokens:
            reasons.append(
                f"tenant {p.tenant}: its keys reserve up to {p.bound_tokens} tokens and its "
                f"token budget has {p.tokens_left} left"
            )
    return DeadlinePlan(
        now=now,
        deadline=deadline,
        margin=margin,
        rates=rates,
        tenants=tenants,
        expected_finish=now + dt.timedelta(seconds=min(finish_s, 10 * 365 * 86_400.0)),
        switch_over=_at(now, split.switch_s),
        flex_until=_at(now, split.flex_until_s),
        feasible=feasible,
        cost_all_standard=sum((w.cost(Tier.STANDARD, w.keys) for w in work), Decimal(0)),
        cost_all_batch=sum((w.cost(Tier.BATCH, w.keys) for w in work), Decimal(0)),
        reasons=tuple(reasons),
    )


def _at(now: dt.datetime, seconds: float | None) -> dt.datetime | None:
    return None if seconds is None else now + dt.timedelta(seconds=seconds)


def _finish_seconds(counts: Mapping[Tier, int], rates: Rates) -> float:
    """When the planned work is expected done: batch back, and flex and standard sharing the
    one limit beside it."""
    flex, standard = counts[Tier.FLEX], counts[Tier.STANDARD]
    batch_s = rates.batch_completion_s if counts[Tier.BATCH] else 0.0
    if (standard and rates.standard_per_s <= 0) or (flex and rates.flex_effective_per_s <= 0):
        return math.inf
    flex_s = flex / rates.flex_effective_per_s if flex else 0.0
    std_s = standard / rates.standard_per_s if standard else 0.0
    return max(batch_s, flex_s + std_s)


def _human(seconds: float) -> str:
    if math.isinf(seconds):
        return "forever"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"
