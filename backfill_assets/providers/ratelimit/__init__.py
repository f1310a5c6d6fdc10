"""Client-side rate limiting per provider endpoint: paced RPM/TPM schedules plus AIMD."""

from backfill_assets.providers.ratelimit.aimd import AdaptiveRate, AimdConfig
from backfill_assets.providers.ratelimit.limiter import (
    AdvertisedLimits,
    EndpointLimiter,
    LimiterConfig,
    Permit,
    Ticket,
)
from backfill_assets.providers.ratelimit.registry import SHARED_LIMITERS, LimiterRegistry
from backfill_assets.providers.ratelimit.schedule import Schedule

__all__ = [
    "SHARED_LIMITERS",
    "AdaptiveRate",
    "AdvertisedLimits",
    "AimdConfig",
    "EndpointLimiter",
    "LimiterConfig",
    "LimiterRegistry",
    "Permit",
    "Schedule",
    "Ticket",
]
