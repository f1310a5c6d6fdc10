"""Client-side rate limiting per provider endpoint: paced RPM/TPM schedules plus AIMD."""

from .aimd import AdaptiveRate, AimdConfig
from .limiter import AdvertisedLimits, EndpointLimiter, LimiterConfig, Permit, Ticket
from .registry import SHARED_LIMITERS, LimiterRegistry
from .schedule import Schedule

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
