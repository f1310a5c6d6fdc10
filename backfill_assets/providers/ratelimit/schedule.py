"""A per-minute limit as a virtual schedule (GCRA, the token bucket in time units; pure).

Instead of a level that callers poll, the bucket keeps ``tat``: the moment it would be full
again. A reservation of ``cost`` gets the earliest start at which the bucket holds ``cost``,
and moves ``tat`` on by ``cost / rate``. Waiters then sleep until their own start time: no
polling and no thundering herd when many tasks wait on one limit, and FIFO by construction.
"""

from __future__ import annotations

import math


class Schedule:
    """One per-minute limit (requests or tokens); ``per_minute <= 0`` means unlimited."""

    def __init__(self, per_minute: float, burst_seconds: float) -> None:
        if burst_seconds <= 0:
            raise ValueError("burst_seconds must be > 0")
        self._burst_s = burst_seconds
        self._rate = max(0.0, per_minute) / 60.0
        self._tat = -math.inf

    @property
    def limited(self) -> bool:
        """False when the limit is off."""
        return self._rate > 0.0

    @property
    def per_minute(self) -> float:
        """The rate in force, per minute."""
        return self._rate * 60.0

    @property
    def capacity(self) -> float:
        """Most units that can go out at once after an idle period."""
        return self._rate * self._burst_s

    def earliest(self, cost: float, now: float) -> float:
        """When ``cost`` fits: the bucket holds it, or is full if ``cost`` exceeds capacity.

        A request larger than the whole bucket waits for a full bucket and leaves it in debt,
        the way providers treat one oversized request, instead of waiting forever.
        """
        if not self.limited:
            return now
        tat = max(self._tat, now)
        slack = max(0.0, self.capacity - cost) / self._rate
        return max(now, tat - slack)

    def commit(self, cost: float, at: float) -> None:
        """Take ``cost`` at time ``at`` (not before ``earliest``)."""
        if self.limited:
            self._tat = max(self._tat, at) + cost / self._rate

    def refund(self, cost: float) -> None:
        """Give back ``cost`` taken earlier (unused tokens, a revoked or refused request)."""
        if self.limited:
            self._tat -= cost / self._rate

    def set_rate(self, per_minute: float, now: float) -> None:
        """Change the rate, keeping the debt (units owed), not the seconds owed."""
        new_rate = max(0.0, per_minute) / 60.0
        if new_rate == self._rate:
            return
        if self.limited and new_rate > 0.0 and self._tat > now:
            owed = (self._tat - now) * self._rate
            self._tat = now + owed / new_rate
        elif new_rate > 0.0 and not self.limited:
            self._tat = -math.inf
        self._rate = new_rate

    def hold_until(self, when: float) -> None:
        """Send nothing before ``when`` (a provider's Retry-After), then start from empty."""
        if self.limited:
            self._tat = max(self._tat, when + self._burst_s)
