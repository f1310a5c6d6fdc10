"""The range of every number a user or a file gives, and reading such a number from text (pure).

A number is checked where it is parsed: a flag's by its argparse type (``cli/numbers.py``), a
file's by its reader (prices, usage reports, policies). Counts and amounts that reach the store
fit its BIGINT columns (2**63 - 1) with room for sums of a few. Text is read with ASCII digits
only, and its length is checked before Python converts it: ``int()`` refuses more than 4,300
digits with a ValueError of its own, and a decimal such as ``1e999999999`` overflows later.
The ranges are listed in docs/operations.md ("Numbers").
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import TypeVar

# Tokens, and nano-dollars ($1,000,000,000), that a user or a file may give: the store's
# BIGINT columns hold 2**63 - 1, so nine such values still add up inside one.
MAX_TOKENS = 10**18
MAX_NANOS = 10**18
# Tokens a provider may report for one call; more is not a real provider's answer.
MAX_CALL_TOKENS = 10**12
# A call's output bound (a tiny JSON object or assessment): it bounds both cost and the budget
# reservation. The safeguard dialect's reasoning has its own, a setting.
MAX_OUTPUT_TOKENS = 64
# USD per million tokens (the dearest list price in 2025 is 600). At this price a call's
# input and output, each at most MAX_CALL_TOKENS, cost at most 2 x 10^18 nano-dollars: a BIGINT.
MAX_PRICE_PER_MILLION = Decimal(1000)
# Seconds a setting may make something wait (a timeout, a back-off, a poll): a day.
MAX_SETTING_SECONDS = 86_400.0
# Unix seconds from 1970-01-01 to 9999-12-31T23:59:59Z (the last second Python dates hold).
MAX_UNIX_SECONDS = 253_402_300_799

# Longer text cannot be a number within any range here; it is refused before conversion.
_MAX_CHARS = 64
_WHOLE = re.compile(r"[+-]?[0-9](?:_?[0-9])*")
_DECIMAL = re.compile(r"[+-]?(?:[0-9](?:_?[0-9])*)?(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?")
# A value quoted in a message: enough for any id or number within range.
_SHOWN = 40
# A path quoted in a message: most of any real one.
PATH_SHOWN = 300

N = TypeVar("N", int, Decimal)


class OutOfRange(ValueError):
    """A number that cannot be read, or lies outside its range (the message says which)."""


def shown(text: str, limit: int = _SHOWN) -> str:
    """A user's value in a message: quoted (control characters escaped), and cut short (a
    path may be given a longer ``limit``)."""
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def bound_text(value: int | Decimal) -> str:
    """A bound as a message and the docs say it: ``1,000,000`` or, from 10**12, ``10^18``."""
    if value >= 10**12 and value == 10 ** (len(str(int(value))) - 1):
        return f"10^{len(str(int(value))) - 1}"
    return f"{value:,}"


def whole_number(text: str, low: int, high: int, what: str = "a whole number") -> int:
    """``text`` as an integer within ``low..high``: ASCII digits, ``_`` between them allowed."""
    raw = text.strip()
    if len(raw) > _MAX_CHARS or not _WHOLE.fullmatch(raw):
        raise OutOfRange(f"{shown(text)} is not {what} ({bound_text(low)} to {bound_text(high)})")
    return in_range(int(raw), low, high, text)


def decimal_number(text: str, low: Decimal, high: Decimal, what: str = "a number") -> Decimal:
    """``text`` as a finite decimal within ``low..high`` (``12.5``, ``1e3``; ASCII only)."""
    raw = text.strip()
    if len(raw) > _MAX_CHARS or not _DECIMAL.fullmatch(raw):
        raise OutOfRange(f"{shown(text)} is not {what} ({bound_text(low)} to {bound_text(high)})")
    try:
        value = Decimal(raw)
    except InvalidOperation:
        raise OutOfRange(f"{shown(text)} is not {what}") from None
    return in_range(value, low, high, text)


def in_range(value: N, low: N, high: N, given: object) -> N:
    """``value`` if ``low <= value <= high``, else OutOfRange quoting ``given`` (the text as
    typed, or the value a file held)."""
    if not low <= value <= high:
        raise OutOfRange(
            f"{_quoted(given)} is out of range: {bound_text(low)} to {bound_text(high)}"
        )
    return value


def _quoted(given: object) -> str:
    if isinstance(given, int) and given.bit_length() > 128:
        # str() of an int past 4,300 digits raises; its size says enough.
        return f"a number of {int(given.bit_length() * 0.30103) + 1} digits"
    return shown(given if isinstance(given, str) else str(given))
