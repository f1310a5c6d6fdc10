"""One limiter per provider endpoint: RPM and TPM schedules, adaptive share, pauses.

Thread-safe and loop-agnostic: state is plain numbers behind a ``threading.Lock``, and the only
awaitable is ``asyncio.sleep`` in the caller's own loop, so one limiter serves every run (each
with its own event loop) in the process without binding to a loop that has since closed.

Flow of one call: ``acquire(estimated_tokens)`` reserves a start time on both schedules and
sleeps until then; the adapter reports back with ``on_success`` (refund the unused reservation,
latency sample, advertised limits), ``on_rate_limited`` (cut, pause for Retry-After) or
``on_failure``. Cuts and pauses revoke tickets that have not started yet, so requests queued
under the old rate are re-timed instead of going out into the overload.
"""

from __future__ import annotations

import asyncio
import collections
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from backfill_assets.config.variables import HttpSettings
from backfill_assets.providers.ratelimit.aimd import AdaptiveRate, AimdConfig
from backfill_assets.providers.ratelimit.schedule import Schedule

Clock = Callable[[], float]
# Timers may fire a hair early; a start this close counts as reached.
_EARLY_S = 0.001
# Window for estimating our own send rate when no limit is configured or advertised.
_RATE_WINDOW_S = 10.0


@dataclass(frozen=True, slots=True)
class LimiterConfig:
    """The endpoint's limits as the settings give them (``HttpSettings``: RPM and TPM, 0 = not
    configured; the longest Retry-After honoured, so a bogus one cannot freeze the endpoint for
    every run in the process; whether to adapt and to trust the limit headers), and how the
    schedules burst and adapt."""

    http: HttpSettings = field(default_factory=HttpSettings)
    burst_seconds: float = 0.25
    aimd: AimdConfig = field(default_factory=AimdConfig)


@dataclass(frozen=True, slots=True)
class AdvertisedLimits:
    """What the provider says its limits are (``x-ratelimit-limit-*``), when it says."""

    requests: int | None = None
    tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Ticket:
    """A reserved start time; void once its generation is revoked."""

    start: float
    tokens: int
    generation: int


@dataclass(frozen=True, slots=True)
class Permit:
    """Leave to send one request now, holding ``tokens`` of the TPM budget."""

    tokens: int
    sent_at: float
    share: float


class EndpointLimiter:
    """Admission control for one provider endpoint, shared by all runs in the process."""

    def __init__(self, config: LimiterConfig, clock: Clock = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        now = clock()
        self._rpm_ceiling: float | None = config.http.rpm or None
        self._tpm_ceiling: float | None = config.http.tpm or None
        self._requests = Schedule(0, config.burst_seconds)
        self._tokens = Schedule(0, config.burst_seconds)
        self._aimd = AdaptiveRate(config.aimd, now)
        self._paused_until = -math.inf
        self._generation = 0
        self._pending_requests = 0
        self._pending_tokens = 0
        self._sends: collections.deque[float] = collections.deque()
        self.sent = 0
        self.rate_limited = 0
        self.capacity_unavailable = 0
        self.revoked = 0
        self.pauses_capped = 0
        self.longest_pause_s = 0.0
        # This process's part of an account-wide limit shared with other processes
        # (``shared.py``), and when each tenant last sent (its weight in that sharing).
        self._fraction = 1.0
        self._tenants_seen: dict[str, float] = {}
        self._refresh_rates(now)

    # -- admission -----------------------------------------------------------------------

    async def acquire(self, tokens: int, tenant: str | None = None) -> Permit:
        """Wait for a send slot for one request of ``tokens`` (estimated) tokens."""
        if tenant is not None:
            with self._lock:
                self._tenants_seen[tenant] = self._clock()
        ticket = self.reserve(tokens)
        try:
            while True:
                got = self.claim(ticket)
                if isinstance(got, Permit):
                    return got
                ticket = got
                await asyncio.sleep(max(0.0, ticket.start - self._clock()))
        except BaseException:
            self.abandon(ticket)
            raise

    def reserve(self, tokens: int) -> Ticket:
        """Book the earliest start on both schedules."""
        with self._lock:
            return self._reserve(tokens, self._clock())

    def claim(self, ticket: Ticket) -> Permit | Ticket:
        """A permit if the ticket's time has come; else the ticket to wait for (re-timed if
        it was revoked)."""
        with self._lock:
            now = self._clock()
            if ticket.generation != self._generation:
                return self._reserve(ticket.tokens, now)
            if ticket.start > now + _EARLY_S:
                return ticket
            self._pending_requests -= 1
            self._pending_tokens -= ticket.tokens
            self.sent += 1
            self._sends.append(now)
            while self._sends and self._sends[0] < now - _RATE_WINDOW_S:
                self._sends.popleft()
            share = self._aimd.share(now) if self.config.http.adaptive else 1.0
            return Permit(ticket.tokens, now, share)

    def abandon(self, ticket: Ticket) -> None:
        """Give back a ticket that will not be used (the waiting task was cancelled)."""
        with self._lock:
            if ticket.generation == self._generation:
                self._pending_requests -= 1
                self._pending_tokens -= ticket.tokens
                self._requests.refund(1)
                self._tokens.refund(ticket.tokens)

    # -- feedback ------------------------------------------------------------------------

    def on_success(
        self,
        permit: Permit,
        latency_s: float,
        charged_tokens: int,
        advertised: AdvertisedLimits | None = None,
    ) -> None:
        """A completed call: correct its token count to what the provider counted, learn."""
        with self._lock:
            now = self._clock()
            extra = charged_tokens - permit.tokens
            if extra < 0:
                self._tokens.refund(-extra)
            elif extra > 0:
                self._tokens.commit(extra, now)
            cut = self.config.http.adaptive and self._aimd.on_latency(latency_s, now)
            if self._learn(advertised) or cut:
                self._revoke(now)

    def on_rate_limited(
        self,
        permit: Permit,
        retry_after: float | None,
        advertised: AdvertisedLimits | None = None,
    ) -> None:
        """A 429: nothing was consumed; pause for Retry-After and cut the rate."""
        with self._lock:
            now = self._clock()
            self.rate_limited += 1
            self._requests.refund(1)
            self._tokens.refund(permit.tokens)
            changed = self._learn(advertised)
            if self.config.http.adaptive:
                if self._rpm_ceiling is None and self._tpm_ceiling is None:
                    # No limit known: our own recent send rate is where the cut starts from
                    # (as an account-wide figure: ours is only our fraction of it).
                    self._rpm_ceiling = self._observed_rpm(now) / self._fraction
                    changed = True
                changed = self._aimd.on_rate_limited(permit.share, permit.sent_at, now) or changed
            paused = retry_after is not None and retry_after > 0
            if changed or paused:
                self._revoke(now)
            if retry_after is not None and paused:
                if retry_after > self.config.http.retry_after_max_seconds:
                    self.pauses_capped += 1
                    retry_after = self.config.http.retry_after_max_seconds
                self.longest_pause_s = max(self.longest_pause_s, retry_after)
                # After the pause the schedules start empty: no burst at the moment every
                # parked request wakes up.
                self._paused_until = max(self._paused_until, now + retry_after)
                self._requests.hold_until(self._paused_until)
                self._tokens.hold_until(self._paused_until)

    def on_capacity_unavailable(self, permit: Permit) -> None:
        """The tier had no capacity (flex): nothing was consumed, and it says nothing about the
        account's limit, so the rate is not cut and no pause is set."""
        with self._lock:
            self.capacity_unavailable += 1
            self._requests.refund(1)
            self._tokens.refund(permit.tokens)

    def on_unused(self, permit: Permit) -> None:
        """A permit whose request was never sent (the run stopped): give its slot back."""
        with self._lock:
            self.sent -= 1
            self._requests.refund(1)
            self._tokens.refund(permit.tokens)

    def on_failure(self, permit: Permit, latency_s: float | None = None) -> None:
        """Any other failure; a timeout's duration counts as a latency sample."""
        if latency_s is None or not self.config.http.adaptive:
            return
        with self._lock:
            now = self._clock()
            if self._aimd.on_latency(latency_s, now):
                self._revoke(now)

    # -- sharing with other processes ----------------------------------------------------

    def weight(self, window_s: float = 10.0) -> float:
        """Tenants this process sent for in the last ``window_s``: its claim on a shared limit."""
        with self._lock:
            now = self._clock()
            for tenant, at in list(self._tenants_seen.items()):
                if at < now - window_s:
                    del self._tenants_seen[tenant]
            n = len(self._tenants_seen)
            return float(n if n else (1 if self._pending_requests else 0))

    @property
    def fraction(self) -> float:
        """This process's part of the configured (account-wide) limits."""
        return self._fraction

    def set_fraction(self, fraction: float) -> None:
        """Pace at ``fraction`` of the configured limits (other processes use the rest)."""
        fraction = min(1.0, max(0.001, fraction))
        with self._lock:
            if abs(fraction - self._fraction) < 0.005 * self._fraction:
                return
            now = self._clock()
            lower = fraction < self._fraction
            self._fraction = fraction
            if lower:
                # Requests queued under the larger share are re-timed, not sent into the
                # newcomer's part of the limit.
                self._revoke(now)
            else:
                self._refresh_rates(now)

    # -- views ---------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Current limits and counters, for run metadata and benchmarks."""
        with self._lock:
            now = self._clock()
            self._refresh_rates(now)
            return {
                "rpm_ceiling": self._rpm_ceiling,
                "tpm_ceiling": self._tpm_ceiling,
                "rpm_in_force": round(self._requests.per_minute, 1),
                "tpm_in_force": round(self._tokens.per_minute, 1),
                "share": round(self._aimd.share(now), 4),
                "sent": self.sent,
                "rate_limited": self.rate_limited,
                "capacity_unavailable": self.capacity_unavailable,
                "cuts": self._aimd.cuts,
                "latency_cuts": self._aimd.latency_cuts,
                "revoked": self.revoked,
                "fraction": round(self._fraction, 4),
                "pauses_capped": self.pauses_capped,
                "longest_pause_s": round(self.longest_pause_s, 3),
            }

    # -- internals (lock held) -----------------------------------------------------------

    def _refresh_rates(self, now: float) -> None:
        share = self._aimd.share(now) if self.config.http.adaptive else 1.0
        share *= self._fraction
        self._requests.set_rate((self._rpm_ceiling or 0.0) * share, now)
        self._tokens.set_rate((self._tpm_ceiling or 0.0) * share, now)

    def _reserve(self, tokens: int, now: float) -> Ticket:
        self._refresh_rates(now)
        start = max(
            now,
            self._paused_until,
            self._requests.earliest(1, now),
            self._tokens.earliest(tokens, now),
        )
        self._requests.commit(1, start)
        self._tokens.commit(tokens, start)
        self._pending_requests += 1
        self._pending_tokens += tokens
        return Ticket(start, tokens, self._generation)

    def _revoke(self, now: float) -> None:
        """Void every ticket not yet started (their holders re-reserve), and take the new rates."""
        if self._pending_requests:
            self.revoked += self._pending_requests
            self._requests.refund(self._pending_requests)
            self._tokens.refund(self._pending_tokens)
        self._pending_requests = 0
        self._pending_tokens = 0
        self._generation += 1
        self._refresh_rates(now)

    def _learn(self, advertised: AdvertisedLimits | None) -> bool:
        """Adopt advertised limits below the ceilings; True if a ceiling dropped."""
        if advertised is None or not self.config.http.trust_limit_headers:
            return False
        lowered = False
        # An advertised limit only ever lowers the ceiling: a configured one is the user's cap.
        if advertised.requests and (
            self._rpm_ceiling is None or advertised.requests < self._rpm_ceiling
        ):
            self._rpm_ceiling = float(advertised.requests)
            lowered = True
        if advertised.tokens and (
            self._tpm_ceiling is None or advertised.tokens < self._tpm_ceiling
        ):
            self._tpm_ceiling = float(advertised.tokens)
            lowered = True
        return lowered

    def _observed_rpm(self, now: float) -> float:
        if not self._sends:
            return 60.0
        span = max(1.0, min(_RATE_WINDOW_S, now - self._sends[0]))
        return max(1.0, len(self._sends) / span * 60.0)
