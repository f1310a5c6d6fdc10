"""How long a call to a provider may take, phase by phase."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from backfill_assets.config.variables import HttpSettings

# OpenAI's advice for flex, which queues: a 15-minute timeout.
FLEX_MIN_TIMEOUT_S = 900.0


@dataclass(frozen=True, slots=True)
class HttpTimeouts:
    """Seconds: to connect, between bytes read, to write, and for the whole call."""

    connect: float
    read: float
    total: float
    write: float = 10.0

    @classmethod
    def of(cls, http: HttpSettings) -> HttpTimeouts:
        """The timeouts the settings give (``BACKFILL_*_TIMEOUT_S``)."""
        return cls(
            connect=http.connect_timeout_s, read=http.read_timeout_s, total=http.total_timeout_s
        )

    def for_httpx(self) -> httpx.Timeout:
        """Per-phase timeouts; the total is enforced around the call."""
        # Waiting for a pooled connection is bounded by the total as well.
        return httpx.Timeout(
            connect=self.connect, read=self.read, write=self.write, pool=self.total
        )
