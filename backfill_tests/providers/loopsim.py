"""A discrete-event closed loop: workers -> EndpointLimiter -> the simulator's RPM/TPM buckets.

Virtual time, no sleeping: minutes of traffic run in well under a second, so the controller's
behaviour (429 share, share of the limit reached) is tested exactly and repeatably.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from dataclasses import dataclass, field

from backfill_assets.providers.ratelimit import (
    AdvertisedLimits,
    EndpointLimiter,
    LimiterConfig,
    Permit,
    Ticket,
)
from backfill_assets.providersim.limits import RateLimiter


class FakeClock:
    """A settable clock shared by the client limiter and the server buckets."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class LoopResult:
    """What the server saw: admission times and 429 times."""

    admitted: list[float] = field(default_factory=list)
    refused: list[float] = field(default_factory=list)
    duration: float = 0.0

    def rate_per_min(self, start: float, end: float) -> float:
        """Admitted requests per minute within [start, end) seconds of the run."""
        n = sum(1 for t in self.admitted if start <= t < end)
        return n / (end - start) * 60.0

    def share_429(self, start: float = 0.0) -> float:
        """Share of requests refused with 429 from ``start`` seconds on."""
        ok = sum(1 for t in self.admitted if t >= start)
        bad = sum(1 for t in self.refused if t >= start)
        return bad / max(1, ok + bad)


def run_loop(
    config: LimiterConfig,
    server_rpm: int,
    server_tpm: int = 0,
    *,
    seconds: float = 120.0,
    workers: int = 64,
    tokens: int = 300,
    charged: int | None = None,
    latency_median_s: float = 0.2,
    latency_sigma: float = 0.5,
    network_s: float = 0.001,
    server_burst_s: float = 1.0,
    advertise: bool = False,
    seed: int = 7,
) -> tuple[LoopResult, EndpointLimiter]:
    """Run ``workers`` always-busy callers for ``seconds`` of virtual time."""
    clock = FakeClock()
    start = clock.now
    limiter = EndpointLimiter(config, clock)
    server = RateLimiter(server_rpm, server_tpm, server_burst_s, clock)
    rng = random.Random(seed)
    events: list[tuple[float, int, str, int, object]] = []
    seq = itertools.count()
    result = LoopResult(duration=seconds)
    adv = AdvertisedLimits(server_rpm or None, server_tpm or None) if advertise else None
    charge = charged if charged is not None else tokens

    def at(t: float, kind: str, worker: int, payload: object = None) -> None:
        heapq.heappush(events, (t, next(seq), kind, worker, payload))

    for w in range(workers):
        at(clock.now + rng.uniform(0, 0.01), "reserve", w)
    while events:
        t, _, kind, w, payload = heapq.heappop(events)
        if t - start >= seconds:
            break
        clock.now = t
        if kind == "reserve":
            ticket = limiter.reserve(tokens)
            at(max(t, ticket.start), "claim", w, ticket)
        elif kind == "claim":
            assert isinstance(payload, Ticket)
            got = limiter.claim(payload)
            if isinstance(got, Permit):
                at(t + network_s * rng.uniform(0.5, 1.5), "arrive", w, got)
            else:
                at(max(t, got.start), "claim", w, got)
        elif kind == "arrive":
            assert isinstance(payload, Permit)
            denial = server.check(charge)
            if denial is not None:
                result.refused.append(t - start)
                at(t + network_s, "refused", w, (payload, denial.wait_seconds))
            else:
                server.consume(charge)
                result.admitted.append(t - start)
                latency = latency_median_s * math.exp(rng.gauss(0.0, latency_sigma))
                at(t + latency, "answered", w, (payload, latency))
        elif kind == "refused":
            permit, wait = payload  # type: ignore[misc]
            limiter.on_rate_limited(permit, wait, adv)
            at(t, "reserve", w)
        elif kind == "answered":
            permit, latency = payload  # type: ignore[misc]
            limiter.on_success(permit, latency + network_s, charge, adv)
            at(t, "reserve", w)
    return result, limiter
