"""The output gate, fuzzed: any model answer is an accepted record or ``OutputRejected``.

The property tests feed arbitrary JSON values, arbitrary strings and near-valid answers with
mutated fields to ``parse_output``; any other exception (OverflowError, ValueError from a
4,300-digit integer, ...) fails them, and so does an accepted answer that breaks the contract.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from backfill_assets.domain.policy.output_gate import ModerationOutput, OutputRejected, parse_output
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.domain.policy.validation import split_valid, stored_result_problems
from backfill_assets.domain.work.keys import Versions

RUBRIC = Rubric()
CONTRACT = RUBRIC.contract
LABELS = RUBRIC.policy.label_ids

KEY = "c0ffee" + "0" * 58
# A stand-in for post text a hostile model echoes back as a key or value.
ECHO = "POSTTEXT-do-not-store"
FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    database=None,
)


def gate(raw: str) -> ModerationOutput | OutputRejected:
    """``parse_output`` with its only allowed failure caught: anything else propagates."""
    try:
        return parse_output(raw, KEY, CONTRACT)
    except OutputRejected as exc:
        return exc


def meets_contract(out: ModerationOutput) -> None:
    """What every accepted answer must be, whatever the raw text was."""
    assert type(out.schema_version) is int and out.schema_version == 1
    assert type(out.correlation_id) is str and out.correlation_id == KEY
    assert out.label in LABELS
    assert type(out.confidence) is float and math.isfinite(out.confidence)
    assert 0.0 <= out.confidence <= 1.0 and math.copysign(1.0, out.confidence) == 1.0


def judge(raw: str) -> ModerationOutput | OutputRejected:
    """Run the gate and check whichever of the two results came out."""
    got = gate(raw)
    if isinstance(got, ModerationOutput):
        meets_contract(got)
    else:
        assert ECHO not in str(got), "a rejection reason echoed the answer's text"
    return got


scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.just(ECHO)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8) | st.just(ECHO), inner, max_size=4)
    ),
    max_leaves=12,
)


@FUZZ
@given(json_values)
def test_any_json_value_is_accepted_or_rejected(value: Any) -> None:
    # json.dumps writes NaN / Infinity as Python does: exactly what a sloppy server may send.
    judge(json.dumps(value))


@FUZZ
@given(st.text(max_size=300))
@example("1" + "0" * 5000)
@example("[" * 100_000)
@example('{"a": ' * 3000)
@example("NaN")
def test_any_string_is_accepted_or_rejected(raw: str) -> None:
    judge(raw)


# Number literals as a server might write them, some far outside what json.dumps produces.
number_literals = st.sampled_from(
    [
        "0",
        "1",
        "0.5",
        "1.0",
        "-0.0",
        "1e-320",
        "0.999999999999999999999",
        "1.0000000000000001",
        "1e999",
        "-1e999",
        "NaN",
        "Infinity",
        "-Infinity",
        "1" + "0" * 400,
        "1" + "0" * 5000,
        "0." + "0" * 5000 + "1",
        "true",
        "false",
        "null",
        '"0.5"',
        '"1"',
        "[]",
        "{}",
    ]
) | st.floats(allow_nan=False, allow_infinity=False).map(repr)
FIELDS = ("schema_version", "correlation_id", "label", "rule_ids", "confidence")
VALID_LITERALS = {
    "schema_version": "1",
    "correlation_id": json.dumps(KEY),
    "label": '"spam"',
    "rule_ids": "[]",
    "confidence": "0.75",
}


def _raw(**literals: str) -> str:
    """The valid answer with some fields replaced by raw JSON literals."""
    merged = {**VALID_LITERALS, **literals}
    return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in merged.items()) + "}"


field_literals = {
    "schema_version": number_literals,
    "correlation_id": st.sampled_from(
        [json.dumps(KEY), json.dumps(KEY.upper()), json.dumps(KEY + " "), "1", "null", '["x"]']
    )
    | number_literals,
    "label": st.sampled_from([*(json.dumps(lb) for lb in LABELS), '"OK"', '"nsfw"', "0", "null"])
    | number_literals,
    # The built-in policy has no rules: only the empty list is valid.
    "rule_ids": st.sampled_from(["[]", '["spam"]', '["R-1"]', '[""]', "[1]", "null", '"[]"', "{}"])
    | number_literals,
    "confidence": number_literals,
}


@st.composite
def near_valid(draw: st.DrawFn) -> tuple[str, bool]:
    """A raw answer that is the valid one with some fields mutated, dropped, doubled or added.

    Returns (raw text, whether an independent reading of the contract accepts it).
    """
    pairs: list[tuple[str, str]] = []
    ok = True
    for name in FIELDS:
        action = draw(st.sampled_from(["keep", "keep", "mutate", "drop", "double"]))
        if action == "drop":
            ok = False
            continue
        literal = VALID_LITERALS[name]
        if action == "mutate":
            literal = draw(field_literals[name])
        pairs.append((name, literal))
        ok = ok and _literal_ok(name, literal)
        if action == "double":
            pairs.append((name, draw(field_literals[name])))
            ok = False  # a duplicate key is ambiguous, even when both values agree
    if draw(st.booleans()):
        pairs.insert(draw(st.integers(0, len(pairs))), (ECHO, draw(number_literals)))
        ok = False
    if draw(st.booleans()):
        pairs = draw(st.permutations(pairs))
    raw = "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in pairs) + "}"
    return raw, ok


def _literal_ok(name: str, literal: str) -> bool:
    """The contract, read independently of the gate's code."""
    if name == "correlation_id":
        return literal == json.dumps(KEY)
    if name == "label":
        return literal in {json.dumps(lb) for lb in LABELS}
    if name == "rule_ids":
        return literal == "[]"
    if literal in ("true", "false", "null", "NaN", "Infinity", "-Infinity") or literal[0] in '"[{':
        return False
    if len(literal) > 40:
        return False  # no confidence a model means; refused rather than rounded
    value = float(literal)
    if name == "schema_version":
        return value == 1
    return math.isfinite(value) and 0.0 <= value <= 1.0


@FUZZ
@given(near_valid())
@example((_raw(schema_version="true"), False))
@example((_raw(confidence="true"), False))
@example((_raw(confidence="1" + "0" * 400), False))
@example((_raw(confidence="1" + "0" * 5000), False))
def test_near_valid_answers_follow_the_contract(case: tuple[str, bool]) -> None:
    raw, expect_ok = case
    got = judge(raw)
    assert isinstance(got, ModerationOutput) == expect_ok, (raw[:200], got)


@pytest.mark.parametrize(
    ("field", "literal", "why"),
    [
        ("schema_version", "true", "schema_version"),
        ("confidence", "true", "confidence"),
        ("confidence", "false", "confidence"),
        ("confidence", "1" + "0" * 400, "number too long"),
        ("confidence", "1" + "0" * 5000, "longer than"),
        ("confidence", "100", "confidence"),
        ("confidence", "NaN", "NaN"),
        ("confidence", "Infinity", "Infinity"),
        ("confidence", "1e999", "out of range"),
        ("correlation_id", "12345", "correlation_id"),
    ],
)
def test_hostile_numbers_and_types_are_schema_rejected(field: str, literal: str, why: str) -> None:
    raw = _raw(**{field: literal})
    with pytest.raises(OutputRejected, match=why):
        parse_output(raw, KEY, CONTRACT)


def test_duplicate_keys_and_deep_nesting_are_rejected() -> None:
    with pytest.raises(OutputRejected, match="duplicate key"):
        parse_output(_raw(label='"abuse", "label": "ok"'), KEY, CONTRACT)
    with pytest.raises(OutputRejected):
        parse_output('{"a": ' * 1500 + "1" + "}" * 1500, KEY, CONTRACT)


def test_rejection_reasons_do_not_echo_the_answer() -> None:
    raw = json.dumps(
        {
            "schema_version": 1,
            "correlation_id": KEY,
            "label": "ok",
            "rule_ids": [],
            "confidence": 0.5,
            ECHO: 1,
        }
    )
    with pytest.raises(OutputRejected) as exc:
        parse_output(raw, KEY, CONTRACT)
    assert ECHO not in str(exc.value) and "extra_forbidden" in str(exc.value)


@FUZZ
@given(
    label=st.sampled_from(LABELS),
    confidence=st.floats(0.0, 1.0) | st.sampled_from(["0", "1", "0.0", "1e-300", "-0.0"]),
)
def test_accepted_outputs_pass_the_writers_frame_check(label: str, confidence: Any) -> None:
    # Whatever the gate accepts, the frame check the writer runs before committing accepts too.
    got = gate(_raw(label=json.dumps(label), confidence=json.dumps(confidence)))
    if isinstance(got, OutputRejected):
        return  # -0.0 and the like: rejected by the gate, never reach the writer
    meets_contract(got)
    row = {
        "key": KEY,
        "tenant_id": "acme",
        "post_id": "p1",
        **got.model_dump(),
        "rule_ids": ",".join(got.rule_ids),
    }
    good, bad = split_valid([row], CONTRACT)
    assert good == [row] and bad == []


CURRENT = Versions("t", "p", "m")


def _frame_row(i: int, **change: Any) -> dict[str, Any]:
    key = f"{i:064x}"
    row = {"key": key, "correlation_id": key, "tenant_id": "acme", "post_id": f"p{i}"}
    row.update(label="ok", rule_ids="", confidence=0.5, schema_version=1, content_hash="ab" * 32)
    row.update(model="m", key_version="p", task_version="t")
    row.update(change)
    return row


# (change, the check named in the reason): each breaks one row of an otherwise valid batch.
_ROW_FAULTS = [
    ({"post_id": 7}, "post_id failed is_str"),
    ({"tenant_id": b"acme"}, "tenant_id failed is_str"),
    ({"post_id": None}, "post_id failed not_nullable"),
    ({"post_id": ""}, "post_id failed str_length"),
    ({"tenant_id": "Acme"}, "tenant_id failed str_matches"),
    ({"label": "fine"}, "row failed label_in_policy"),
    ({"label": "spam", "rule_ids": "X-1"}, "row failed rules_fit_label"),
    ({"rule_ids": "a b"}, "row failed rules_fit_label"),
    ({"key": "f" * 63}, "key failed str_matches"),
]


@pytest.mark.parametrize(("change", "why"), _ROW_FAULTS)
def test_the_frame_check_rejects_only_the_bad_row(change: dict[str, Any], why: str) -> None:
    # A value of the wrong type among strings is that row's fault, not the batch's.
    rows = [_frame_row(i) for i in range(5)]
    rows[2] = _frame_row(2, **change)
    if "key" in change:
        rows[2]["correlation_id"] = rows[2]["key"]
    good, bad = split_valid(rows, CONTRACT)
    assert good == rows[:2] + rows[3:]
    assert [r["post_id"] for r, _ in bad] == [rows[2]["post_id"]]
    assert bad[0][1].startswith(f"result frame: {why}")  # then the check's parameters
    stored = stored_result_problems(rows, CONTRACT, CURRENT)
    assert [k for k, _ in stored] == [str(rows[2]["key"])]
    assert stored[0][1].startswith(why)


def test_the_frame_check_passes_valid_batches_of_any_size() -> None:
    for n in (1, 2, 300):
        rows = [_frame_row(i) for i in range(n)]
        assert split_valid(rows, CONTRACT) == (rows, [])
        assert stored_result_problems(rows, CONTRACT, CURRENT) == []


def test_cli_start_up_does_not_import_pandas_or_pandera() -> None:
    # A no-op `run` pays its start-up only; the frame schemas load on the first validation.
    code = (
        "import sys, backfill_assets.cli; "
        "print([m for m in ('pandas', 'pandera') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert split_valid([], CONTRACT) == ([], [])
