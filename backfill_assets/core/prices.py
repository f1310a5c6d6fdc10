"""Price table: USD per million tokens per model, for the cost booked with each usage event.

Prices are decimals and a call's cost is whole nano-dollars (``core/money.py``): no float
ever touches money."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from backfill_assets.core.money import nanos_for, whole_nanos

_log = logging.getLogger(__name__)


class Price(BaseModel):
    """What one million input and output tokens cost, in USD."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: Decimal = Field(ge=0, description="USD per 1M prompt tokens.")
    output: Decimal = Field(ge=0, description="USD per 1M completion tokens.")
    cached_input: Decimal | None = Field(
        default=None, ge=0, description="USD per 1M prompt tokens read from cache (default: input)."
    )
    cache_write: Decimal | None = Field(
        default=None,
        ge=0,
        description="USD per 1M prompt tokens written to cache (default: input).",
    )


# Public list prices (standard tier) at the time of writing; override with BACKFILL_PRICES.
DEFAULT_PRICES: Mapping[str, Price] = {
    "gpt-4o-mini": Price(
        input=Decimal("0.15"), output=Decimal("0.60"), cached_input=Decimal("0.075")
    ),
    "gpt-4o": Price(input=Decimal("2.50"), output=Decimal("10.00"), cached_input=Decimal("1.25")),
    "gpt-4.1": Price(input=Decimal("2.00"), output=Decimal("8.00"), cached_input=Decimal("0.50")),
    "gpt-4.1-mini": Price(
        input=Decimal("0.40"), output=Decimal("1.60"), cached_input=Decimal("0.10")
    ),
    "gpt-4.1-nano": Price(
        input=Decimal("0.10"), output=Decimal("0.40"), cached_input=Decimal("0.025")
    ),
}


class PriceError(ValueError):
    """A price table that cannot be read."""


@dataclass(frozen=True)
class PriceTable:
    """Prices by model; a dated snapshot (``gpt-4o-mini-2024-07-18``) uses its family's price."""

    prices: Mapping[str, Price]

    @classmethod
    def from_json(cls, text: str, base: Mapping[str, Price] = DEFAULT_PRICES) -> PriceTable:
        """``{"model": {"input": 0.15, "output": 0.6}, ...}`` on top of ``base``."""
        if not text.strip():
            return cls(dict(base))
        try:
            # Numbers as decimals: 0.15 is 0.15, not the float nearest to it.
            raw = json.loads(text, parse_float=Decimal)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
            raise PriceError(f"unreadable price table: {type(exc).__name__}") from None
        if not isinstance(raw, dict):
            raise PriceError("price table must be a JSON object keyed by model")
        try:
            extra = {str(model): Price.model_validate(price) for model, price in raw.items()}
        except ValidationError as exc:
            raise PriceError(f"unreadable price table: {type(exc).__name__}") from None
        return cls({**base, **extra})

    def price_for(self, model: str) -> Price | None:
        """Exact match, else the longest family prefix followed by ``-``."""
        if model in self.prices:
            return self.prices[model]
        family = [m for m in self.prices if model.startswith(m + "-")]
        return self.prices[max(family, key=len)] if family else None

    def cost(
        self,
        model: str,
        tokens_in: int,
        tokens_out: int,
        factor: Decimal = Decimal(1),
        cached: int = 0,
        cache_written: int = 0,
    ) -> int:
        """Nano-dollars for one call (at ``factor`` x the list price: 0.5 for batch), rounded
        once; ``cached`` and ``cache_written`` of ``tokens_in`` at their own prices. 0 (with
        one warning per model) when the model has no price."""
        price = self.price_for(model)
        if price is None:
            _warn_unpriced(model)
            return 0
        plain = max(0, tokens_in - cached - cache_written)
        exact = (
            nanos_for(plain, price.input)
            + nanos_for(cached, price.input if price.cached_input is None else price.cached_input)
            + nanos_for(
                cache_written, price.input if price.cache_write is None else price.cache_write
            )
            + nanos_for(tokens_out, price.output)
        )
        return whole_nanos(exact * factor)


_unpriced: set[str] = set()


def _warn_unpriced(model: str) -> None:
    if model not in _unpriced:
        _unpriced.add(model)
        _log.warning("no price for model %r: cost booked as 0 (set BACKFILL_PRICES)", model)
