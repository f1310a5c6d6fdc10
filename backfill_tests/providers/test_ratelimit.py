"""The rate limiter on a fake clock: schedules, AIMD, revocation, and the closed loop."""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time

import pytest

from backfill_assets.config.variables import HttpSettings
from backfill_assets.providers.ratelimit import (
    AdaptiveRate,
    AdvertisedLimits,
    AimdConfig,
    EndpointLimiter,
    LimiterConfig,
    LimiterRegistry,
    Permit,
    Schedule,
    Ticket,
)
from backfill_tests.providers.loopsim import FakeClock, run_loop


def test_schedule_paces_at_the_rate_after_the_burst() -> None:
    s = Schedule(per_minute=600, burst_seconds=0.5)  # 10/s, 5 at once
    starts = []
    for _ in range(25):
        start = s.earliest(1, 100.0)
        s.commit(1, start)
        starts.append(start)
    assert starts[:5] == [100.0] * 5
    gaps = [round(b - a, 9) for a, b in itertools.pairwise(starts[4:])]
    assert set(gaps) == {0.1}
    assert starts[-1] == pytest.approx(100.0 + 2.0)


def test_schedule_refund_and_oversized_costs() -> None:
    s = Schedule(per_minute=6000, burst_seconds=1.0)  # 100 tokens/s, capacity 100
    s.commit(100, 0.0)
    assert s.earliest(50, 0.0) == pytest.approx(0.5)
    s.refund(60)  # usage came in lower than reserved
    assert s.earliest(50, 0.0) == pytest.approx(0.0)
    # Larger than the bucket: waits for a full bucket, then goes into debt.
    s2 = Schedule(per_minute=60, burst_seconds=1.0)
    s2.commit(5, 0.0)
    assert s2.earliest(5, 0.0) == pytest.approx(5.0)
    assert Schedule(0, 1.0).earliest(10**9, 3.0) == 3.0  # unlimited


def test_schedule_rate_change_keeps_the_debt_in_units() -> None:
    s = Schedule(per_minute=60, burst_seconds=1.0)
    for _ in range(3):
        s.commit(1, s.earliest(1, 0.0))  # owes 3 units at t=0 -> full again at t=3
    s.set_rate(120, 0.0)
    assert s.earliest(1, 0.0) == pytest.approx(1.5 - 0.5)


def test_aimd_cuts_once_per_epoch_and_recovers_below_the_hit_then_probes() -> None:
    a = AdaptiveRate(AimdConfig(), now=0.0)
    assert a.share(10.0) == 1.0
    assert a.on_rate_limited(sent_share=1.0, sent_at=9.9, now=10.0)
    assert a.share(10.0) == pytest.approx(0.85)
    # A 429 for a request sent before the cut is old news.
    assert not a.on_rate_limited(sent_share=1.0, sent_at=9.95, now=10.1)
    assert a.share(10.1) < 0.86
    assert a.target == pytest.approx(0.97)
    # Recovers towards 97% of the share that drew the 429, not beyond, quickly.
    assert a.share(13.0) == pytest.approx(0.97 - 0.12 * math.exp(-1.0), abs=1e-3)
    assert a.share(40.0) == pytest.approx(0.97, abs=1e-9)
    # Then probes slowly upwards.
    assert 0.97 < a.share(50.0) < 0.97 * 1.05


def test_aimd_latency_inflation_cuts_mildly() -> None:
    a = AdaptiveRate(AimdConfig(latency_min_samples=20), now=0.0)
    t = 0.0
    for _ in range(200):
        t += 0.02
        assert not a.on_latency(0.2, t)
    cuts = 0
    for _ in range(100):
        t += 0.02
        cuts += a.on_latency(0.8, t)
    assert 1 <= cuts <= 2  # at most one per latency epoch (2 s)
    assert 0.85 < a.share(t) < 1.0
    assert a.latency_cuts == cuts


def _limiter(clock: FakeClock, burst_seconds: float = 0.25, **http: object) -> EndpointLimiter:
    return EndpointLimiter(LimiterConfig(HttpSettings(**http), burst_seconds), clock)


def test_limiter_reserves_on_both_limits_and_refunds_unused_tokens() -> None:
    clock = FakeClock()
    t0 = clock.now
    lim = _limiter(clock, rpm=6000, tpm=6000, burst_seconds=1.0, adaptive=False)
    first = lim.reserve(100)  # the whole TPM bucket
    assert first.start == t0
    second = lim.reserve(100)
    assert second.start == pytest.approx(t0 + 1.0)  # tokens bind, not requests
    permit = lim.claim(first)
    assert isinstance(permit, Permit)
    lim.on_success(permit, 0.2, charged_tokens=40)  # 60 tokens come back
    # The refund lets a newcomer in earlier than the queue implied.
    third = lim.reserve(50)
    assert third.start < second.start + 0.5


def test_limiter_revokes_waiting_tickets_on_a_cut_and_pauses_for_retry_after() -> None:
    clock = FakeClock()
    t0 = clock.now
    lim = _limiter(clock, rpm=600, burst_seconds=0.1, trust_limit_headers=False)
    tickets = [lim.reserve(10) for _ in range(10)]  # one every 0.1 s
    permit = lim.claim(tickets[0])
    assert isinstance(permit, Permit)
    clock.now += 0.05
    lim.on_rate_limited(permit, retry_after=2.0)
    # Every queued ticket is void; re-timed, none starts before the Retry-After moment.
    for ticket in tickets[1:]:
        got = lim.claim(ticket)
        assert isinstance(got, Ticket) and got.start >= t0 + 2.05
    assert lim.snapshot()["revoked"] == 9
    assert lim.snapshot()["share"] == pytest.approx(0.85, abs=0.01)
    # Long Retry-After values (a quota window) are honoured in full.
    late = lim.claim(lim.reserve(10))
    while not isinstance(late, Permit):
        clock.now = late.start
        late = lim.claim(late)
    lim.on_rate_limited(late, retry_after=120.0)
    assert lim.reserve(10).start >= clock.now + 120.0


def test_limiter_learns_lower_advertised_limits_only() -> None:
    clock = FakeClock()
    lim = _limiter(clock, rpm=6000, tpm=10_000_000)
    permit = lim.claim(lim.reserve(10))
    assert isinstance(permit, Permit)
    lim.on_success(permit, 0.1, 10, AdvertisedLimits(requests=3000, tokens=99_000_000))
    snap = lim.snapshot()
    assert (snap["rpm_ceiling"], snap["tpm_ceiling"]) == (3000, 10_000_000)
    off = _limiter(clock, rpm=6000, trust_limit_headers=False)
    permit = off.claim(off.reserve(10))
    assert isinstance(permit, Permit)
    off.on_success(permit, 0.1, 10, AdvertisedLimits(requests=3000))
    assert off.snapshot()["rpm_ceiling"] == 6000


def test_limiter_without_any_limit_starts_from_its_observed_rate_on_a_429() -> None:
    clock = FakeClock()
    lim = _limiter(clock)
    permits = []
    for _ in range(50):
        p = lim.claim(lim.reserve(1))
        assert isinstance(p, Permit)
        permits.append(p)
        clock.now += 0.1  # 10/s = 600/min
    lim.on_rate_limited(permits[-1], retry_after=None)
    snap = lim.snapshot()
    assert snap["rpm_ceiling"] == pytest.approx(600, rel=0.05)
    assert snap["rpm_in_force"] == pytest.approx(600 * 0.85, rel=0.05)


def test_one_limiter_paces_callers_on_several_event_loops() -> None:
    """Two threads, each with its own loop (two runs in one process), share one schedule."""
    lim = LimiterRegistry().get(
        "http://x/v1#m", LimiterConfig(HttpSettings(rpm=6000), burst_seconds=0.1)
    )
    stamps: list[float] = []
    lock = threading.Lock()

    async def caller() -> None:
        for _ in range(40):
            await lim.acquire(1)
            with lock:
                stamps.append(time.monotonic())

    threads = [threading.Thread(target=asyncio.run, args=(caller(),)) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(10)
    assert len(stamps) == 80
    stamps.sort()
    # 100/s with a burst of 10: 80 sends need at least 0.7 s, whatever the loops.
    assert stamps[-1] - stamps[0] >= 0.69
    # The same limiter is handed out again, and it is usable from a fresh loop.
    asyncio.run(lim.acquire(1))


def test_registry_keys_by_endpoint_and_restarts_on_new_config() -> None:
    reg = LimiterRegistry()
    a = reg.get("u#m", LimiterConfig(HttpSettings(rpm=10)))
    assert reg.get("u#m", LimiterConfig(HttpSettings(rpm=10))) is a
    assert reg.get("u#other", LimiterConfig(HttpSettings(rpm=10))) is not a
    assert reg.get("u#m", LimiterConfig(HttpSettings(rpm=20))) is not a


def test_cancelled_waiter_gives_its_slot_back() -> None:
    clock = FakeClock()
    lim = _limiter(clock, rpm=60, burst_seconds=1.0, adaptive=False)
    assert isinstance(lim.claim(lim.reserve(1)), Permit)
    waiting = lim.reserve(1)
    assert waiting.start == pytest.approx(clock.now + 1.0)
    lim.abandon(waiting)
    assert lim.reserve(1).start == pytest.approx(clock.now + 1.0)


# -- closed loop: the controller against the simulator's own buckets, in virtual time --------


def test_closed_loop_correct_limit_reaches_it_without_429s() -> None:
    result, _ = run_loop(LimiterConfig(HttpSettings(rpm=3000)), server_rpm=3000, seconds=180)
    assert result.share_429() <= 0.002
    assert result.rate_per_min(10, 180) >= 0.99 * 3000


def test_closed_loop_limit_configured_twice_too_high_converges() -> None:
    config = LimiterConfig(HttpSettings(rpm=6000, trust_limit_headers=False))
    result, limiter = run_loop(config, server_rpm=3000, seconds=300, latency_sigma=0.8)
    assert result.share_429(60) <= 0.02
    assert result.share_429() <= 0.05
    assert result.rate_per_min(60, 300) >= 0.95 * 3000
    assert limiter.snapshot()["rpm_in_force"] <= 3000 * 1.1


def test_closed_loop_tpm_bound_uses_the_token_limit() -> None:
    # The reservation (400) overestimates what the server counts (320): refunds recover it.
    config = LimiterConfig(HttpSettings(rpm=3000, tpm=600_000))
    result, _ = run_loop(
        config, 3000, 600_000, seconds=180, tokens=400, charged=320, latency_sigma=0.5
    )
    achieved_tpm = result.rate_per_min(10, 180) * 320
    assert achieved_tpm >= 0.99 * 600_000
    assert result.share_429() <= 0.002


def test_closed_loop_advertised_limits_avoid_the_overshoot() -> None:
    result, _ = run_loop(LimiterConfig(HttpSettings(rpm=12000)), 3000, seconds=120, advertise=True)
    assert result.share_429() <= 0.002


def test_closed_loop_without_adaptation_storms() -> None:
    """The control: the same loop with a fixed 2x-too-high rate is mostly 429s."""
    config = LimiterConfig(HttpSettings(rpm=6000, adaptive=False, trust_limit_headers=False))
    result, _ = run_loop(config, 3000, seconds=60)
    assert result.share_429(10) > 0.3
