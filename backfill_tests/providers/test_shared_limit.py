"""One provider limit shared by every process that uses it: membership, fair
shares per tenant, reclaiming a dead member's share."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from backfill_assets.config.variables import HttpSettings
from backfill_assets.ledger.spend import limiter_members
from backfill_assets.providers.ratelimit import EndpointLimiter, LimiterConfig
from backfill_assets.providers.ratelimit.shared import SharedLimits


@dataclass(frozen=True)
class _Shares:
    own: float
    total: float
    members: int

    @property
    def fraction(self) -> float:
        return self.own / self.total if self.total else 1.0


class _Table:
    """An in-memory membership table with a settable clock."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[float, float]] = {}
        self.now = 0.0

    def beat(self, _endpoint: str, member: str, weight: float) -> _Shares:
        self.rows = {m: r for m, r in self.rows.items() if r[1] >= self.now - 5.0}
        self.rows[member] = (weight, self.now)
        total = sum(w for w, _ in self.rows.values())
        return _Shares(weight, total, len(self.rows))

    def leave(self, _endpoint: str, member: str) -> None:
        self.rows.pop(member, None)


def _tenants(limiter: EndpointLimiter, *tenants: str) -> None:
    """The limiter learns whom it sends for from ``acquire``."""

    async def send() -> None:
        for t in tenants:
            limiter.on_unused(await limiter.acquire(1, t))

    asyncio.run(send())


def test_limit_is_split_per_tenant_and_given_back_on_leave() -> None:
    table = _Table()
    a = EndpointLimiter(LimiterConfig(HttpSettings(rpm=1200), burst_seconds=60))
    b = EndpointLimiter(LimiterConfig(HttpSettings(rpm=1200), burst_seconds=60))
    _tenants(a, "acme")
    _tenants(b, "globex", "initech", "umbrella")
    shared_a, shared_b = SharedLimits(), SharedLimits()
    with shared_a.member(a, "ep", table.beat, table.leave, interval_s=60):
        assert a.fraction == 1.0  # alone
        with shared_b.member(b, "ep", table.beat, table.leave, interval_s=60):
            assert b.fraction == 0.75  # three tenants of four
            shared_a.refresh()
            assert a.fraction == 0.25
            snap = a.snapshot()
            assert snap["rpm_in_force"] == 300.0
        shared_a.refresh()
        assert a.fraction == 1.0  # b left cleanly: its share is back
    assert table.rows == {}


def test_a_killed_member_is_dropped_after_the_ttl(engine: Engine) -> None:
    ep = "http://x/v1#m#k"
    first = limiter_members.heartbeat(engine, ep, "alive", 1.0, ttl_s=5.0)
    assert first.fraction == 1.0 and first.members == 1
    limiter_members.heartbeat(engine, ep, "doomed", 3.0, ttl_s=5.0)
    shares = limiter_members.heartbeat(engine, ep, "alive", 1.0, ttl_s=5.0)
    assert shares.members == 2 and shares.fraction == 0.25
    # "doomed" stops heartbeating (SIGKILL): after the TTL it no longer counts.
    time.sleep(0.6)
    shares = limiter_members.heartbeat(engine, ep, "alive", 1.0, ttl_s=0.5)
    assert shares.members == 1 and shares.fraction == 1.0
    # Other endpoints are other accounts.
    other = limiter_members.heartbeat(engine, "http://y/v1#m#k", "z", 1.0, ttl_s=5.0)
    assert other.members == 1
    limiter_members.leave(engine, ep, "alive")
    assert limiter_members.heartbeat(engine, ep, "new", 2.0, ttl_s=5.0).members == 1
