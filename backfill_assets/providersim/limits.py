"""RPM and TPM token buckets with OpenAI-style rate-limit headers.

Each limit is a bucket refilled continuously at ``limit / 60`` per second holding at most
``limit / 60 * burst_seconds``, the way providers quantise per-minute limits to short windows.
A request larger than the whole bucket is admitted once the bucket is full and leaves it in
debt, so a small TPM setting slows callers down instead of rejecting them forever.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from typing import Literal

from backfill_assets.providersim.config import RetryAfterFormat

Clock = Callable[[], float]
LimitKind = Literal["requests", "tokens"]
# Absorbs float drift when a client waits exactly the advertised retry-after-ms.
_EPSILON = 1e-6
HUGE_RETRY_AFTER = "1000000000000"


class TokenBucket:
    """A continuously refilled bucket for one per-minute limit (not thread-safe)."""

    def __init__(self, limit_per_minute: int, burst_seconds: float, clock: Clock) -> None:
        self.limit = limit_per_minute
        self.rate = limit_per_minute / 60.0
        self.capacity = self.rate * burst_seconds
        self._clock = clock
        self._level = self.capacity
        self._stamp = clock()

    def _refill(self) -> float:
        now = self._clock()
        self._level = min(self.capacity, self._level + (now - self._stamp) * self.rate)
        self._stamp = now
        return self._level

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` can be taken; 0.0 if it can be taken now."""
        need = min(amount, self.capacity)
        missing = need - self._refill()
        return 0.0 if missing <= _EPSILON else missing / self.rate

    def take(self, amount: float) -> None:
        """Remove ``amount`` (the caller checked ``wait_for`` first)."""
        self._refill()
        self._level -= amount

    def remaining(self) -> int:
        """Whole units available now."""
        return max(0, math.floor(self._refill() + _EPSILON))

    def seconds_to_full(self) -> float:
        """Seconds until the bucket is back to its initial state."""
        return max(0.0, (self.capacity - self._refill()) / self.rate)

    def fill(self) -> None:
        """Back to full, as after a long idle period."""
        self._level = self.capacity
        self._stamp = self._clock()


@dataclass(frozen=True, slots=True)
class Denial:
    """Why a request was refused and how long until it would fit."""

    kind: LimitKind
    limit: int
    requested: int
    wait_seconds: float


class RateLimiter:
    """Both per-minute limits; a request is admitted only if both buckets can pay for it."""

    def __init__(
        self, rpm: int, tpm: int, burst_seconds: float, clock: Clock = time.monotonic
    ) -> None:
        self._requests = TokenBucket(rpm, burst_seconds, clock) if rpm > 0 else None
        self._tokens = TokenBucket(tpm, burst_seconds, clock) if tpm > 0 else None

    def check(self, tokens: int) -> Denial | None:
        """A denial if either bucket lacks capacity now; consumes nothing."""
        if self._requests is not None:
            wait = self._requests.wait_for(1)
            if wait > 0.0:
                return Denial("requests", self._requests.limit, 1, wait)
        if self._tokens is not None:
            wait = self._tokens.wait_for(tokens)
            if wait > 0.0:
                return Denial("tokens", self._tokens.limit, tokens, wait)
        return None

    def consume(self, tokens: int) -> None:
        """Charge one request and ``tokens`` tokens."""
        if self._requests is not None:
            self._requests.take(1)
        if self._tokens is not None:
            self._tokens.take(tokens)

    def headers(self) -> dict[str, str]:
        """``x-ratelimit-*`` headers for the limits that are configured."""
        out: dict[str, str] = {}
        for kind, bucket in (("requests", self._requests), ("tokens", self._tokens)):
            if bucket is None:
                continue
            out[f"x-ratelimit-limit-{kind}"] = str(bucket.limit)
            out[f"x-ratelimit-remaining-{kind}"] = str(bucket.remaining())
            out[f"x-ratelimit-reset-{kind}"] = format_duration(bucket.seconds_to_full())
        return out

    def reset(self) -> None:
        """Refill both buckets."""
        for bucket in (self._requests, self._tokens):
            if bucket is not None:
                bucket.fill()


def retry_after_headers(
    wait_seconds: float, fmt: RetryAfterFormat = "both", now: float | None = None
) -> dict[str, str]:
    """The 429's retry hint in ``fmt``; by default ``retry-after`` and ``retry-after-ms``.

    ``seconds``: whole seconds, at least 1; ``ms``: ``retry-after-ms`` alone; ``http_date``:
    an IMF-fixdate rounded up to the second (``now`` defaults to the wall clock); ``huge``:
    ``retry-after: 1000000000000``, the bogus value some gateways send; ``none``: no hint.
    """
    seconds = str(max(1, math.ceil(wait_seconds)))
    millis = str(max(1, math.ceil(wait_seconds * 1000.0)))
    if fmt == "both":
        return {"retry-after": seconds, "retry-after-ms": millis}
    if fmt == "seconds":
        return {"retry-after": seconds}
    if fmt == "ms":
        return {"retry-after-ms": millis}
    if fmt == "http_date":
        at = math.ceil((time.time() if now is None else now) + wait_seconds)
        return {"retry-after": formatdate(at, usegmt=True)}
    if fmt == "huge":
        return {"retry-after": HUGE_RETRY_AFTER}
    return {}


def exhausted_headers(limits: dict[str, int], reset_seconds: float) -> dict[str, str]:
    """``x-ratelimit-*`` headers claiming every limit is used up until ``reset_seconds``."""
    out: dict[str, str] = {}
    for kind, limit in limits.items():
        out[f"x-ratelimit-limit-{kind}"] = str(limit)
        out[f"x-ratelimit-remaining-{kind}"] = "0"
        out[f"x-ratelimit-reset-{kind}"] = format_duration(reset_seconds)
    return out


def format_duration(seconds: float) -> str:
    """Go-style duration as in OpenAI's reset headers: ``20ms``, ``1.5s``, ``6m0s``, ``1h2m3s``."""
    millis = max(0, math.ceil(seconds * 1000.0))
    if millis == 0:
        return "0s"
    if millis < 1000:
        return f"{millis}ms"
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"
