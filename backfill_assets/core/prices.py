"""Price table: USD per million tokens per model, for the cost booked with each usage event."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError

_log = logging.getLogger(__name__)


class Price(BaseModel):
    """What one million input and output tokens cost, in USD."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0.0, description="USD per 1M prompt tokens.")
    output: float = Field(ge=0.0, description="USD per 1M completion tokens.")


# Public list prices (standard tier) at the time of writing; override with BACKFILL_PRICES.
DEFAULT_PRICES: Mapping[str, Price] = {
    "gpt-4o-mini": Price(input=0.15, output=0.60),
    "gpt-4o": Price(input=2.50, output=10.00),
    "gpt-4.1": Price(input=2.00, output=8.00),
    "gpt-4.1-mini": Price(input=0.40, output=1.60),
    "gpt-4.1-nano": Price(input=0.10, output=0.40),
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
            raw = json.loads(text)
            if not isinstance(raw, dict):
                raise PriceError("price table must be a JSON object keyed by model")
            extra = {str(model): Price.model_validate(price) for model, price in raw.items()}
        except (json.JSONDecodeError, ValidationError) as exc:
            raise PriceError(f"unreadable price table: {type(exc).__name__}") from None
        return cls({**base, **extra})

    def price_for(self, model: str) -> Price | None:
        """Exact match, else the longest family prefix followed by ``-``."""
        if model in self.prices:
            return self.prices[model]
        family = [m for m in self.prices if model.startswith(m + "-")]
        return self.prices[max(family, key=len)] if family else None

    def cost(self, model: str, tokens_in: int, tokens_out: int) -> float:
        """USD for one call; 0.0 (with one warning per model) when the model has no price."""
        price = self.price_for(model)
        if price is None:
            _warn_unpriced(model)
            return 0.0
        return (tokens_in * price.input + tokens_out * price.output) / 1_000_000


_unpriced: set[str] = set()


def _warn_unpriced(model: str) -> None:
    if model not in _unpriced:
        _unpriced.add(model)
        _log.warning("no price for model %r: cost booked as 0 (set BACKFILL_PRICES)", model)
