"""Reading a number from text: within its range, or one ``OutOfRange`` that quotes it briefly;
never Python's own ValueError, OverflowError or a decimal signal."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_assets.domain.money.nanos import nanos_of_usd
from backfill_assets.domain.money.prices import Price
from backfill_assets.domain.ranges import (
    MAX_CALL_TOKENS,
    MAX_NANOS,
    MAX_PRICE_PER_MILLION,
    MAX_TOKENS,
    OutOfRange,
    bound_text,
    decimal_number,
    whole_number,
)

BIGINT_MAX = 2**63 - 1

# Text that looks like a number, and text that almost does.
numberish = st.one_of(
    st.text(),
    st.from_regex(r"[+-]?[0-9_]{0,30}(\.[0-9]{0,12})?([eE][+-]?[0-9]{1,12})?", fullmatch=True),
    st.sampled_from(["nan", "NaN", "sNaN", "inf", "-Infinity", "1e999999999", "\u0661\u0660"]),
    st.integers(min_value=1, max_value=6000).map(lambda n: "9" * n),
)


def test_sums_of_a_few_maximal_values_fit_a_bigint() -> None:
    assert 9 * max(MAX_TOKENS, MAX_NANOS) <= BIGINT_MAX


def test_the_largest_call_at_the_dearest_price_costs_a_bigint_at_most() -> None:
    top = Price(
        input=MAX_PRICE_PER_MILLION,
        output=MAX_PRICE_PER_MILLION,
        cached_input=MAX_PRICE_PER_MILLION,
        cache_write=MAX_PRICE_PER_MILLION,
    )
    most = MAX_CALL_TOKENS - 1
    assert top.cost(most, most, cached=most // 2, cache_written=most // 2) <= BIGINT_MAX
    assert top.bound(most, most) <= BIGINT_MAX
    assert top.halved().cost(most, most) <= BIGINT_MAX


@given(numberish)
def test_a_whole_number_is_in_range_or_refused(text: str) -> None:
    try:
        value = whole_number(text, 0, MAX_TOKENS)
    except OutOfRange as exc:
        assert len(str(exc)) < 500  # 40 characters, escaped
    else:
        assert 0 <= value <= MAX_TOKENS


@given(numberish)
def test_a_decimal_is_finite_and_in_range_or_refused(text: str) -> None:
    try:
        value = decimal_number(text, Decimal(-5), Decimal(10**9))
    except OutOfRange as exc:
        assert len(str(exc)) < 500  # 40 characters, escaped
    else:
        assert value.is_finite() and -5 <= value <= 10**9


@given(numberish)
def test_a_dollar_amount_is_whole_nanos_within_a_billion_or_refused(text: str) -> None:
    try:
        nanos = nanos_of_usd(text)
    except ValueError as exc:
        assert len(str(exc)) < 500  # 40 characters, escaped
    else:
        assert 0 <= nanos <= MAX_NANOS


@pytest.mark.parametrize(
    ("text", "value"),
    [("0", 0), ("1_000", 1000), (" 7 ", 7), ("+3", 3), ("1" + "0" * 18, 10**18)],
)
def test_ascii_digits_with_underscores_are_read(text: str, value: int) -> None:
    assert whole_number(text, 0, MAX_TOKENS) == value


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("1" + "0" * 18 + "1", "out of range: 0 to 10^18"),
        ("-1", "out of range"),
        ("\u0661\u0660", "is not a whole number"),
        ("1e3", "is not a whole number"),
        ("9" * 5000, f"'{'9' * 40}...' is not a whole number"),
    ],
)
def test_what_is_refused_says_why(text: str, words: str) -> None:
    with pytest.raises(OutOfRange, match=words.replace(".", r"\.").replace("^", r"\^")):
        whole_number(text, 0, MAX_TOKENS)


def test_bounds_are_shown_as_the_docs_write_them() -> None:
    assert [bound_text(v) for v in (0, 1_000_000, 10**18, Decimal(1000))] == [
        "0",
        "1,000,000",
        "10^18",
        "1,000",
    ]
