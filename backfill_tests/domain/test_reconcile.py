"""The provider's usage report is a file from outside: every number in it has a range, and a
report that cannot be read is one ``ReportError`` naming where, never a traceback."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_assets.domain.money.reconcile import ReportError, read_report


def _page(start: Any = 0, **result: Any) -> str:
    row = {"model": "m", "num_model_requests": 1, "input_tokens": 5, **result}
    return json.dumps({"data": [{"start_time": start, "results": [row]}]})


def _costs(value: Any) -> str:
    result = {"object": "organization.costs.result", "amount": {"value": value}}
    return json.dumps({"data": [{"start_time": 0, "results": [result]}]})


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested"),
        (_page() + "\n" + "[" * 100_000 + "]" * 100_000, "line 2: nested"),
        (_page(start=10**13), "start_time: .* is out of range"),
        (_page(start=-1), "start_time: .* is out of range"),
        (_page().replace('"input_tokens": 5', '"input_tokens": ' + "9" * 5000), "5000 digits"),
        (_page(output_tokens=10**19), "output_tokens: '10+' is out of range: 0 to 10"),
        (_costs("sNaN"), "amount.value"),
        (_costs("NaN"), "amount.value"),
        (_costs("1e999999999"), "amount.value"),
        (_costs("1" * 5000), "amount.value"),
        (_costs("-1e30"), "amount.value"),
        (_costs(None), "amount.value"),
        (_costs("1e3").replace('"1e3"', "1e999999999"), "amount.value"),
    ],
)
def test_a_number_out_of_range_is_refused_naming_where(text: str, words: str) -> None:
    with pytest.raises(ReportError, match=words) as exc:
        read_report(text)
    assert len(str(exc.value)) < 600


def test_the_edges_of_the_ranges_are_read() -> None:
    report = read_report(_page(start=253_402_300_799, output_tokens=10**18))
    assert report.usage[("9999-12-31", "m")]["tokens_out"] == 10**18
    assert read_report(_costs("-1000000000")).cost_by_day == {"1970-01-01": -(10**9)}


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(["sNaN", "NaN", "Infinity", "1e999999999", "-0"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


@given(
    start=json_values,
    tokens=json_values,
    amount=json_values,
)
def test_any_values_in_a_report_read_or_are_refused(start: Any, tokens: Any, amount: Any) -> None:
    text = _page(start=start, input_tokens=tokens) + "\n" + _costs(amount)
    try:
        read_report(text)
    except ReportError as exc:
        assert len(str(exc)) < 600  # values quoted are cut to 40 characters
