"""Money is integer nano-dollars (1e-9 USD): exact, summed in any order to the same total.

Prices are decimals (USD per million tokens); a call's cost is rounded once, half to even, to
a whole nano-dollar, and everything after that is integer arithmetic: the ledger, the rollup,
invoices. Dollars are shown as ``Decimal`` strings with nine places, never as floats.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation

from backfill_assets.domain.ranges import MAX_NANOS, shown

NANOS_PER_USD = 10**9
_ONE_NANO_IN_USD = Decimal("0.000000001")
# A price is USD per million tokens: one token at that price is price x 1,000 nano-dollars.
_NANOS_PER_TOKEN_AT_ONE_USD_PER_MILLION = Decimal(1000)


def nanos_for(tokens: int, usd_per_million: Decimal) -> Decimal:
    """The exact (unrounded) nano-dollars of ``tokens`` at a price per million."""
    return Decimal(tokens) * usd_per_million * _NANOS_PER_TOKEN_AT_ONE_USD_PER_MILLION


def whole_nanos(amount: Decimal) -> int:
    """An exact amount rounded once, half to even, to whole nano-dollars."""
    return int(amount.to_integral_value(rounding=ROUND_HALF_EVEN))


def nanos_of_usd(text: str) -> int:
    """A dollar amount as typed (``50``, ``12.5``, ``$0.000001``) in whole nano-dollars, at most
    ``MAX_NANOS`` ($1,000,000,000); ValueError for anything else, negative, or finer than a
    nano-dollar."""
    raw = text.strip().removeprefix("$").replace("_", "")
    try:
        # ASCII and short: Decimal() would take other scripts' digits and any length.
        if not raw.isascii() or len(raw) > 64:
            raise InvalidOperation
        amount = Decimal(raw)
    except InvalidOperation:
        raise ValueError(f"{shown(text)} is not a dollar amount (e.g. 50 or 12.50)") from None
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"{shown(text)}: a budget is a finite amount of at least 0 dollars")
    # Compared as dollars: 1e999999999 times a billion would overflow the decimal context.
    if amount > MAX_NANOS // NANOS_PER_USD:
        raise ValueError(f"{shown(text)}: a budget is at most ${MAX_NANOS // NANOS_PER_USD:,}")
    if amount != amount.quantize(_ONE_NANO_IN_USD):
        raise ValueError(f"{shown(text)}: finer than a nano-dollar (at most 9 decimal places)")
    return int(amount * NANOS_PER_USD)


def usd(nanos: int) -> Decimal:
    """Nano-dollars as dollars, exactly (nine decimal places)."""
    return (Decimal(nanos) / NANOS_PER_USD).quantize(_ONE_NANO_IN_USD)


def usd_rounded(nanos: int, places: int) -> Decimal:
    """Dollars rounded once, half up, to ``places`` decimals (invoices: 6 per row, 2 in total)."""
    exact = Decimal(nanos) / NANOS_PER_USD
    return exact.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)


def usd_text(nanos: int) -> str:
    """Dollars as shown and exported: ``0.033374000``."""
    return f"{usd(nanos):.9f}"


def cached_share(cached: int, tokens_in: int) -> str:
    """Cached input tokens as a share of input tokens, as shown: ``"0.8734"`` (4 places)."""
    if tokens_in <= 0:
        return "0.0000"
    return f"{Decimal(cached) / Decimal(tokens_in):.4f}"


def cost_text(nanos: int, calls_unknown: int) -> str:
    """A report's cost: dollars, or ``unknown`` when some calls had no price (never a $0 that
    is really a missing price): ``>= 0.120000000 (3 calls unknown)`` when only some did."""
    if calls_unknown <= 0:
        return usd_text(nanos)
    if nanos == 0:
        return f"unknown ({calls_unknown} calls unpriced)"
    return f">= {usd_text(nanos)} ({calls_unknown} calls unpriced)"
