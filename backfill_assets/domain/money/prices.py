"""Price table: USD per million tokens per model, tier and date, for the cost booked with each
usage event.

Prices are decimals and a call's cost is whole nano-dollars (``domain/money/nanos.py``): no float
ever touches money. A model's prices are a list of dated entries; a call is priced at the entry
in force on its day, so a price change never rewrites what was booked before it. Each entry
prices three tiers: ``standard``, ``batch`` and ``flex``; batch and flex are half of standard
unless given."""

from __future__ import annotations

import datetime as dt
import enum
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from backfill_assets.domain.money.nanos import nanos_for, whole_nanos
from backfill_assets.domain.ranges import MAX_PRICE_PER_MILLION

_log = logging.getLogger(__name__)

_HALF = Decimal("0.5")
# An entry with no ``from`` applies since the beginning.
ALWAYS = dt.date(1970, 1, 1)


class Tier(enum.StrEnum):
    """How a call is served and billed: cheapest first."""

    BATCH = "batch"
    FLEX = "flex"
    STANDARD = "standard"


def tier_served(reported: object) -> Tier:
    """The tier a chat completion was billed at, from its ``service_tier`` field: ``flex`` when
    the provider says so; any other answer (``default``, ``auto``, ``scale``, none) is standard."""
    # A gateway that drops the field gets the dearer price: a booked cost may overstate the
    # bill, never understate it (``verify`` and the reconcile report show the difference).
    return Tier.FLEX if reported == "flex" else Tier.STANDARD


class Price(BaseModel):
    """What one million tokens cost, in USD, at one tier."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: Decimal = Field(ge=0, le=MAX_PRICE_PER_MILLION, description="USD per 1M prompt tokens.")
    output: Decimal = Field(
        ge=0, le=MAX_PRICE_PER_MILLION, description="USD per 1M completion tokens."
    )
    cached_input: Decimal | None = Field(
        default=None,
        ge=0,
        le=MAX_PRICE_PER_MILLION,
        description="USD per 1M prompt tokens read from cache (default: input).",
    )
    cache_write: Decimal | None = Field(
        default=None,
        ge=0,
        le=MAX_PRICE_PER_MILLION,
        description="USD per 1M prompt tokens written to cache (default: input).",
    )

    def halved(self) -> Price:
        """Half of every price (the batch and flex default)."""
        return Price(
            input=self.input * _HALF,
            output=self.output * _HALF,
            cached_input=None if self.cached_input is None else self.cached_input * _HALF,
            cache_write=None if self.cache_write is None else self.cache_write * _HALF,
        )

    def cost(self, tokens_in: int, tokens_out: int, cached: int = 0, cache_written: int = 0) -> int:
        """Nano-dollars for one call, rounded once; ``cached`` and ``cache_written`` are part
        of ``tokens_in`` and priced at their own rates."""
        plain = max(0, tokens_in - cached - cache_written)
        exact = (
            nanos_for(plain, self.input)
            + nanos_for(cached, self.input if self.cached_input is None else self.cached_input)
            + nanos_for(cache_written, self.input if self.cache_write is None else self.cache_write)
            + nanos_for(tokens_out, self.output)
        )
        return whole_nanos(exact)

    def bound(self, prompt_tokens: int, output_tokens: int) -> int:
        """The most a call of at most these tokens can cost: every prompt token at the
        dearest prompt rate (no cache discount assumed; a cache write may cost more)."""
        dearest = max(
            self.input,
            self.input if self.cached_input is None else self.cached_input,
            self.input if self.cache_write is None else self.cache_write,
        )
        return whole_nanos(
            nanos_for(prompt_tokens, dearest) + nanos_for(output_tokens, self.output)
        )


class DatedPrice(BaseModel):
    """A model's prices per tier from one day on (until the next entry's day)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    since: dt.date = Field(default=ALWAYS, alias="from")
    standard: Price
    batch: Price | None = None
    flex: Price | None = None

    def at(self, tier: Tier) -> Price:
        """This entry's price at ``tier`` (batch and flex: half of standard unless given)."""
        given = {Tier.BATCH: self.batch, Tier.FLEX: self.flex}.get(tier)
        if tier is Tier.STANDARD:
            return self.standard
        return given if given is not None else self.standard.halved()


@dataclass(frozen=True, slots=True)
class BookedPrice:
    """The price a call was booked at: enough to reproduce its cost from the event alone."""

    model: str
    tier: Tier
    since: dt.date
    price: Price

    def to_json(self) -> str:
        """Compact JSON for the ledger (decimals as strings)."""
        p = self.price
        body: dict[str, str] = {
            "model": self.model,
            "tier": self.tier.value,
            "from": self.since.isoformat(),
            "input": str(p.input),
            "output": str(p.output),
        }
        if p.cached_input is not None:
            body["cached_input"] = str(p.cached_input)
        if p.cache_write is not None:
            body["cache_write"] = str(p.cache_write)
        return json.dumps(body, separators=(",", ":"))


def _std(**kw: str) -> tuple[DatedPrice, ...]:
    return (DatedPrice(since=_LIST_DATE, standard=Price(**{k: Decimal(v) for k, v in kw.items()})),)


# OpenAI's public list prices (standard tier; batch and flex at half) as of this date.
_LIST_DATE = dt.date(2025, 8, 7)
DEFAULT_PRICES: Mapping[str, tuple[DatedPrice, ...]] = {
    "gpt-4o-mini": _std(input="0.15", output="0.60", cached_input="0.075"),
    "gpt-4o": _std(input="2.50", output="10.00", cached_input="1.25"),
    "gpt-4.1": _std(input="2.00", output="8.00", cached_input="0.50"),
    "gpt-4.1-mini": _std(input="0.40", output="1.60", cached_input="0.10"),
    "gpt-4.1-nano": _std(input="0.10", output="0.40", cached_input="0.025"),
    "o4-mini": _std(input="1.10", output="4.40", cached_input="0.275"),
    "gpt-5": _std(input="1.25", output="10.00", cached_input="0.125"),
    "gpt-5-mini": _std(input="0.25", output="2.00", cached_input="0.025"),
    "gpt-5-nano": _std(input="0.05", output="0.40", cached_input="0.005"),
    # The moderation endpoint is free: a call books its zero tokens at zero.
    "omni-moderation-latest": _std(input="0", output="0"),
    "text-moderation-latest": _std(input="0", output="0"),
}


class PriceError(ValueError):
    """A price table that cannot be read."""


def _entries(model: str, value: Any) -> tuple[DatedPrice, ...]:
    """Today's form (one standard price for all time) or a list of dated entries."""
    if isinstance(value, list):
        entries = sorted((DatedPrice.model_validate(v) for v in value), key=lambda e: e.since)
        if not entries:
            raise PriceError(f"price table: {model!r} has an empty list of prices")
        days = [e.since for e in entries]
        if len(set(days)) != len(days):
            raise PriceError(f"price table: {model!r} has two prices from the same day")
        return tuple(entries)
    return (DatedPrice(standard=Price.model_validate(value)),)


@dataclass(frozen=True)
class PriceTable:
    """Prices by model; a dated snapshot (``gpt-4o-mini-2024-07-18``) uses its family's price."""

    prices: Mapping[str, Sequence[DatedPrice]]

    @classmethod
    def from_json(
        cls, text: str, base: Mapping[str, Sequence[DatedPrice]] = DEFAULT_PRICES
    ) -> PriceTable:
        """``{"model": {"input": 0.15, "output": 0.6}}`` (standard, for all time) or
        ``{"model": [{"from": "2026-01-01", "standard": {..}, "batch": {..}}, ..]}``, on top
        of ``base``: a model named here replaces its built-in prices."""
        if not text.strip():
            return cls(dict(base))
        try:
            # Numbers as decimals: 0.15 is 0.15, not the float nearest to it.
            raw = json.loads(text, parse_float=Decimal)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
            raise PriceError(f"unreadable price table: {type(exc).__name__}") from None
        if not isinstance(raw, dict):
            raise PriceError("price table must be a JSON object keyed by model")
        extra: dict[str, tuple[DatedPrice, ...]] = {}
        for model, value in raw.items():
            try:
                extra[str(model)] = _entries(str(model), value)
            except ValidationError as exc:
                where = ".".join(str(p) for p in exc.errors()[0]["loc"])
                raise PriceError(
                    f"unreadable price table: {model!r}: {where}: {exc.errors()[0]['msg']}"
                ) from None
        return cls({**base, **extra})

    def _entries_for(self, model: str) -> Sequence[DatedPrice] | None:
        """Exact match, else the longest family prefix followed by ``-``."""
        if model in self.prices:
            return self.prices[model]
        family = [m for m in self.prices if model.startswith(m + "-")]
        return self.prices[max(family, key=len)] if family else None

    def booked(
        self, model: str, tier: Tier = Tier.STANDARD, day: dt.date | None = None
    ) -> BookedPrice | None:
        """The price in force for ``model`` at ``tier`` on ``day`` (today, UTC, by default);
        before a model's first dated entry, that first entry. None: not priced."""
        entries = self._entries_for(model)
        if not entries:
            return None
        when = day or dt.datetime.now(dt.UTC).date()
        entry = entries[0]
        for e in entries:
            if e.since <= when:
                entry = e
        return BookedPrice(model, tier, entry.since, entry.at(tier))

    def price_for(self, model: str, tier: Tier = Tier.STANDARD) -> Price | None:
        """Today's price for ``model`` at ``tier``, if any."""
        found = self.booked(model, tier)
        return None if found is None else found.price

    def cost(
        self,
        model: str,
        tokens_in: int,
        tokens_out: int,
        *,
        cached: int = 0,
        cache_written: int = 0,
        tier: Tier = Tier.STANDARD,
        day: dt.date | None = None,
    ) -> int:
        """Nano-dollars for one call at ``tier`` on ``day``, rounded once. 0 (with one warning
        per model) when the model has no price: only reachable with BACKFILL_ALLOW_UNPRICED."""
        found = self.booked(model, tier, day)
        if found is None:
            _warn_unpriced(model)
            return 0
        return found.price.cost(tokens_in, tokens_out, cached, cache_written)

    def cost_bound(
        self, model: str, tiers: Sequence[Tier], prompt_tokens: int, output_tokens: int
    ) -> int | None:
        """The most a call can cost if booked at any of ``tiers``, at today's price or
        tomorrow's (a call sent before midnight is booked after it). None: not priced."""
        today = dt.datetime.now(dt.UTC).date()
        bounds: list[int] = []
        for tier in tiers:
            for day in (today, today + dt.timedelta(days=1)):
                found = self.booked(model, tier, day)
                if found is None:
                    return None
                bounds.append(found.price.bound(prompt_tokens, output_tokens))
        return max(bounds) if bounds else None


_unpriced: set[str] = set()


def _warn_unpriced(model: str) -> None:
    if model not in _unpriced:
        _unpriced.add(model)
        _log.warning("no price for model %r: cost booked as 0 (set BACKFILL_PRICES)", model)


def event_cost(
    table: PriceTable,
    model: str,
    tier: Tier,
    shape: str | None,
    tokens: tuple[int, int, int, int],
    max_output_tokens: int,
    day: dt.date | None = None,
) -> int:
    """A usage event's cost under ``table``, booked the way the dispatcher books a call:
    ``tokens`` is (in, cached, cache written, out); a ``total``-only event is priced as the
    dearest split the call allowed (its completion at the cap)."""
    tokens_in, cached, written, tokens_out = tokens
    if shape == "total":
        out = min(tokens_in, max_output_tokens)
        return table.cost(model, tokens_in - out, out, tier=tier, day=day)
    return table.cost(
        model, tokens_in, tokens_out, cached=cached, cache_written=written, tier=tier, day=day
    )
