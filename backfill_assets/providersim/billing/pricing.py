"""The simulator's own price list and the cost of each call it bills (pure).

Written apart from the product's ``domain/money/prices.py`` on purpose: tests compare the ledger's
booked cost with this meter's, so the two must not share the arithmetic they check. Each call
is rounded once, half to even, to whole nano-dollars, as a provider's per-request bill is.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

# tier -> share of the standard price
_TIER_SHARE = {"default": Fraction(1), "flex": Fraction(1, 2), "batch": Fraction(1, 2)}


def call_cost_nanos(
    prices: Mapping[str, tuple[str, str, str]],
    model: str,
    prompt: int,
    cached: int,
    completion: int,
    tier: str,
) -> int:
    """Nano-dollars billed for one call; 0 for a model the list does not price."""
    price = prices.get(model)
    if price is None:
        return 0
    usd_in, usd_cached, usd_out = (Fraction(p) for p in price)
    usd = (prompt - cached) * usd_in + cached * usd_cached + completion * usd_out
    # USD per million tokens x tokens = micro-dollars; x 1,000 = nano-dollars.
    nanos = usd * 1000 * _TIER_SHARE[tier]
    return round(nanos)  # Fraction rounds half to even
