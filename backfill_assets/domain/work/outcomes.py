"""Terminal outcomes of a key and the retry policy (pure)."""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass


class Outcome(enum.StrEnum):
    """How a key ended in one run. Only ``accepted`` writes a label."""

    ACCEPTED = "accepted"
    SCHEMA_REJECTED = "schema_rejected"
    RETRY_EXHAUSTED = "retry_exhausted"
    TRANSPORT_REJECTED = "transport_rejected"
    DEFERRED = "deferred"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded attempts with exponential back-off and full jitter."""

    max_attempts: int = 5
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0
    # A provider's Retry-After is honoured even beyond max_delay_s, up to this ceiling.
    max_retry_after_s: float = 900.0

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (attempt is 1-based)."""
        ceiling = min(self.max_delay_s, self.base_delay_s * (2 ** (attempt - 1)))
        jittered = rng.uniform(0.0, ceiling)
        if retry_after is not None and retry_after > 0:
            # The provider said when; spread the herd a little past that point.
            return min(retry_after, self.max_retry_after_s) + rng.uniform(0.0, min(1.0, ceiling))
        return jittered

    def exhausted(self, attempt: int) -> bool:
        """True when ``attempt`` was the last one allowed."""
        return attempt >= self.max_attempts
