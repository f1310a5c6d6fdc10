"""Process-wide limiters: one per provider endpoint, shared by every run in the process."""

from __future__ import annotations

import threading
import time

from backfill_assets.providers.ratelimit.limiter import Clock, EndpointLimiter, LimiterConfig


class LimiterRegistry:
    """Process-wide limiters, one per endpoint (base URL and model)."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._limiters: dict[str, EndpointLimiter] = {}

    def get(self, endpoint: str, config: LimiterConfig) -> EndpointLimiter:
        """The endpoint's limiter; a changed configuration starts a fresh one."""
        with self._lock:
            limiter = self._limiters.get(endpoint)
            if limiter is None or limiter.config != config:
                limiter = self._limiters[endpoint] = EndpointLimiter(config, self._clock)
            return limiter


SHARED_LIMITERS = LimiterRegistry()
