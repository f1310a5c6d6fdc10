"""How long to hold back: the enqueued-token limit gate and status-poll pacing (no I/O).

Both are shared by all chunks of a run: a 429 on one status call or a token-limit refusal of
one batch says the organisation is at its limit, not that one chunk is.
"""

from __future__ import annotations


class TokenGate:
    """No new batch while the organisation's enqueued-token limit is reached."""

    def __init__(self, first_wait_s: float, max_wait_s: float) -> None:
        self._first = first_wait_s
        self._max = max_wait_s
        self.wait_s = first_wait_s
        self.until = 0.0
        # Refusals since the gate was last reopened (a batch of ours ended).
        self.refusals = 0

    def is_open(self, now: float) -> bool:
        """Whether a batch may be created now."""
        return now >= self.until

    def refused(self, now: float, again: bool) -> float:
        """A batch was refused for the limit; returns the seconds to hold back.

        Only a fresh refusal (``again``: of keys refused before, or a create refused after the
        gate reopened on its own) backs off further: batches created before the first
        refusal were refused for the same reason.
        """
        self.refusals += 1
        if again:
            self.wait_s = min(self.wait_s * 2, self._max)
        self.until = max(self.until, now + self.wait_s)
        return self.until - now

    def reopen(self) -> None:
        """One of our batches left the queue: its tokens are free again."""
        self.until, self.wait_s, self.refusals = 0.0, self._first, 0


class PollPacer:
    """Spacing of status calls: grows on each 429, shrinks back on success."""

    def __init__(self, max_gap_s: float) -> None:
        self._max = max_gap_s
        self.gap_s = 0.0
        self.paused_until = 0.0

    def rate_limited(self, now: float, retry_after_s: float | None) -> float:
        """A status call got a 429; returns the pause before any further status call."""
        self.gap_s = min(max(self.gap_s * 2, 0.05), self._max)
        pause = max(retry_after_s or 0.0, self.gap_s)
        self.paused_until = now + pause
        return pause

    def answered(self) -> None:
        """A status call was answered."""
        self.gap_s = self.gap_s / 2 if self.gap_s > 0.01 else 0.0
