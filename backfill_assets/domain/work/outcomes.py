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
    """Bounded attempts with exponential back-off and full jitter (``RunSettings.retry``
    builds it from the settings, where each bound is declared with its default)."""

    max_attempts: int
    retry_base_seconds: float
    retry_max_seconds: float
    # A provider's Retry-After is honoured even beyond retry_max_seconds, up to this ceiling.
    retry_after_max_seconds: float

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (attempt is 1-based)."""
        ceiling = min(self.retry_max_seconds, self.retry_base_seconds * (2 ** (attempt - 1)))
        jittered = rng.uniform(0.0, ceiling)
        if retry_after is not None and retry_after > 0:
            # The provider said when; spread the herd a little past that point.
            return min(retry_after, self.retry_after_max_seconds) + rng.uniform(
                0.0, min(1.0, ceiling)
            )
        return jittered

    def exhausted(self, attempt: int) -> bool:
        """True when ``attempt`` was the last one allowed."""
        return attempt >= self.max_attempts
