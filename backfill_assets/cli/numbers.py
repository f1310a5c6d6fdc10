"""Numbers on the command line: each flag's type checks its range while the line is parsed.

A value out of range, non-finite, too long or not in ASCII digits exits 2 naming the flag
(argparse's own message) before the command opens the store or writes a file. The ranges are
in each flag's help and in docs/operations.md ("Numbers on the command line").
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from backfill_assets.domain.money import DeadlineError, nanos_of_usd, parse_deadline
from backfill_assets.domain.ranges import (
    MAX_TOKENS,
    OutOfRange,
    bound_text,
    decimal_number,
    shown,
    whole_number,
)

# A deadline further ahead than this is not a backfill's: a year and a day.
MAX_DEADLINE = dt.timedelta(days=366)
# A duration counted from here comes out as this plus itself; an ISO time as itself.
_ORIGIN = dt.datetime(1, 1, 1, tzinfo=dt.UTC)
_SECOND = dt.timedelta(seconds=1)


def count(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number within ``low..high``."""

    def parse(text: str) -> int:
        try:
            return whole_number(text, low, high)
        except OutOfRange as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = "count"
    return parse


def seconds(high: float) -> Callable[[str], float]:
    """An argparse ``type``: a finite number of seconds within ``0..high``."""

    def parse(text: str) -> float:
        try:
            return float(decimal_number(text, Decimal(0), Decimal(high), "a number of seconds"))
        except OutOfRange as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = "seconds"
    return parse


@dataclass(frozen=True, slots=True)
class Cap:
    """A budget flag's value: a cap, or ``None`` when ``none`` removes it."""

    value: int | None


def usd_cap(text: str) -> Cap:
    """``--usd``: dollars (up to 9 decimals, ``$`` and ``_`` allowed) up to $1,000,000,000,
    or ``none``."""
    if text.strip().lower() == "none":
        return Cap(None)
    try:
        return Cap(nanos_of_usd(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def token_cap(text: str) -> Cap:
    """``--tokens``: a whole number of tokens, 0 to 10^18, or ``none``."""
    if text.strip().lower() == "none":
        return Cap(None)
    try:
        return Cap(whole_number(text, 0, MAX_TOKENS, "a whole number of tokens"))
    except OutOfRange as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def deadline(text: str) -> str:
    """``--deadline``: an ISO time or a duration (``domain/money/deadline.py``) at most
    ``MAX_DEADLINE`` ahead. The text is kept: the command reads it against its own clock, and
    says then if it is past (a stored plan is resumed whatever the flag says)."""
    try:
        from_origin = parse_deadline(text, _ORIGIN)
        is_duration = parse_deadline(text, _ORIGIN + _SECOND) != from_origin
    except DeadlineError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    except (OverflowError, ValueError):  # a duration past any date
        raise argparse.ArgumentTypeError(_too_far(text)) from None
    ahead = from_origin - (_ORIGIN if is_duration else dt.datetime.now(dt.UTC))
    if ahead > MAX_DEADLINE:
        raise argparse.ArgumentTypeError(_too_far(text))
    return text


def _too_far(text: str) -> str:
    return f"{shown(text)} is more than {bound_text(MAX_DEADLINE.days)} days ahead"


def margin_share(raw: str) -> float:
    """``--margin``: a percentage of the time left (``10`` or ``10%``), 0 to 90."""
    try:
        value = float(raw.strip().rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(raw)} is not a percentage") from None
    if not 0.0 <= value <= 90.0:
        raise argparse.ArgumentTypeError(f"{shown(raw)} must be within 0 and 90 (percent)")
    return value / 100.0


def share(what: str) -> Callable[[str], float]:
    """An argparse ``type``: a finite number from 0 to 1 (``--target-macro-f1``)."""

    def parse(text: str) -> float:
        try:
            return float(decimal_number(text, Decimal(0), Decimal(1), what))
        except OutOfRange as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = "share"
    return parse
