"""Cascade files: every rule with its line and column, the decide rules, the two versions, the
policy each stage must be able to read, and hostile files (never a traceback)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from backfill_assets.config.variables import ModelSettings
from backfill_assets.domain.cascade import (
    Cascade,
    CascadeInvalid,
    CascadeStage,
    Decide,
    cascade_problems,
    decides,
    load_cascade,
    parse_cascade,
    stage_score,
)
from backfill_assets.domain.cascade.file import DEFAULT_VARIANTS, MAX_CASCADE_BYTES
from backfill_assets.domain.policy.dialect_sections import DIALECTS
from backfill_assets.domain.policy.file import builtin_policy, load_policy
from backfill_tests.policy_helpers import DOCS_POLICIES

FORUM = DOCS_POLICIES / "forum-moderation.yaml"

GOOD = """\
stages:
  - name: screen
    dialect: openai-moderation
    model: omni-moderation-latest
    decide: {when: none_label, min_score: 0.97}   # decide "nothing applies" when confident
  - name: first-pass
    dialect: llama-guard
    model: meta-llama/Llama-Guard-4-12B
    decide:
      when: any_label
      min_score: 1
  - name: judge
    dialect: chat-json
    model: gpt-4o-mini
"""


def problems(text: str) -> list[tuple[int, int, str]]:
    with pytest.raises(CascadeInvalid) as exc:
        parse_cascade(text, "c.yaml")
    assert exc.value.source == "c.yaml"
    return [(p.line, p.column, p.message) for p in exc.value.problems]


def one(text: str, words: str) -> tuple[int, int, str]:
    """The line, column and message of the one problem of ``text`` that says ``words``."""
    found = [p for p in problems(text) if words in p[2]]
    assert len(found) == 1, found
    return found[0]


def test_a_valid_file_has_its_stages_in_order() -> None:
    cascade = parse_cascade(GOOD)
    assert cascade == Cascade(
        (
            CascadeStage(
                "screen",
                "openai-moderation",
                "omni-moderation-latest",
                Decide("none_label", 0.97),
                2,
            ),
            CascadeStage(
                "first-pass",
                "llama-guard",
                "meta-llama/Llama-Guard-4-12B",
                Decide("any_label", 1.0),
                6,
            ),
            CascadeStage("judge", "chat-json", "gpt-4o-mini", None, 12),
        )
    )
    # YAML's integer 1 is the number 1.0, not a bool and not an int left as such.
    min_score = cascade.stages[1].decide.min_score  # type: ignore[union-attr]
    assert type(min_score) is float
    assert [s.env_suffix for s in cascade.stages] == ["SCREEN", "FIRST_PASS", "JUDGE"]
    assert cascade.stages[1].base_url_var == "BACKFILL_MODEL_BASE_URL__FIRST_PASS"
    assert cascade.stages[1].api_key_var == "BACKFILL_MODEL_API_KEY__FIRST_PASS"


def test_one_stage_is_a_cascade_and_decides_everything() -> None:
    cascade = parse_cascade("stages:\n  - {name: only, dialect: chat-json, model: m}\n")
    assert [(s.name, s.decide, s.line) for s in cascade.stages] == [("only", None, 2)]


BROKEN = """\
stages:
  - name: first-pass
    dialect: openai
    model: "a b"
    base_url: https://example.test/v1
    api_key: sk-123
    decide: {when: some, min_score: true, extra: 1}
  - name: first_pass
    dialect: chat-json
    model: ""
  - name: Bad
    dialect: llama-guard
    model: m
    decide: {when: any_label, min_score: 1.5}
  - 3
  - name: last
    dialect: safeguard
    model: gpt-oss-20b
    decide: {when: any_label, min_score: 0.5}
colour: red
"""


def test_every_problem_is_listed_at_once_with_its_line_and_column() -> None:
    found = problems(BROKEN)
    assert [(line, col) for line, col, _ in found] == [
        (3, 14),
        (4, 12),
        (5, 5),
        (6, 5),
        (7, 20),
        (7, 37),
        (7, 43),
        (8, 5),
        (8, 11),
        (10, 12),
        (11, 11),
        (14, 42),
        (15, 5),
        (19, 5),
        (20, 1),
    ], found
    says = [message for _, _, message in found]
    expected = [
        "stages[0].dialect: 'openai': expected one of chat-json, openai-moderation, "
        "llama-guard, safeguard",
        "stages[0].model: 'a b' holds whitespace or a control character",
        "BACKFILL_MODEL_BASE_URL__FIRST_PASS",
        "BACKFILL_MODEL_API_KEY__FIRST_PASS",
        "stages[0].decide.when: 'some': expected one of none_label, any_label",
        "stages[0].decide.min_score: true is not a number",
        "stages[0].decide: unknown field 'extra'",
        "stages[1]: missing field 'decide'",
        "'first_pass' and 'first-pass' (line 2) would read the same variables",
        "stages[1].model: must not be empty",
        "stages[2].name: 'Bad' must match ^[a-z][a-z0-9_-]{0,30}$",
        "stages[2].decide.min_score: 1.5 is not from 0 to 1",
        "stages[3]: a stage is a mapping of name, dialect, model, decide",
        "stages[4].decide: the last stage decides everything that reaches it",
        "the cascade: unknown field 'colour' (expected stages)",
    ]
    for message, words in zip(says, expected, strict=True):
        assert words in message, (message, words)
    with pytest.raises(CascadeInvalid) as exc:
        parse_cascade(BROKEN, "c.yaml")
    assert str(exc.value).startswith("15 problem(s) in cascade c.yaml:\nc.yaml:3:14: ")


@pytest.mark.parametrize(
    ("text", "line", "column", "words"),
    [
        ("[1, 2]\n", 1, 1, "a cascade is a mapping with one field, stages"),
        ("stage: []\n", 1, 1, "unknown field 'stage'"),
        ("stages: []\n", 1, 9, "stages: must be a list of 1 to 8 stages"),
        ("stages: {name: a}\n", 1, 9, "stages: must be a list of 1 to 8 stages"),
        ("stages:\n  - name: a\n", 2, 5, "missing field 'dialect'"),
        ("stages:\n  - {name: 7, dialect: chat-json, model: m}\n", 2, 12, "name: must be text"),
        ("stages:\n  - {name: a, dialect: chat-json, model: 7}\n", 2, 42, "model: must be text"),
        (
            "stages:\n  - {name: a, dialect: chat-json, model: " + "m" * 201 + "}\n",
            2,
            42,
            "longer than 200 characters",
        ),
        (
            'stages:\n  - {name: a, dialect: chat-json, model: "m\\u202e"}\n',
            2,
            42,
            "whitespace or a control character",
        ),
        (
            "stages:\n  - {name: " + "a" * 32 + ", dialect: chat-json, model: m}\n",
            2,
            12,
            "must match",
        ),
        (
            "stages:\n  - {name: a, dialect: chat-json, model: m, decide: 0.9}\n"
            "  - {name: b, dialect: chat-json, model: m}\n",
            2,
            53,
            "decide: must be a mapping of when and min_score",
        ),
        (
            "stages:\n  - {name: a, dialect: chat-json, model: m, decide: {when: any_label}}\n"
            "  - {name: b, dialect: chat-json, model: m}\n",
            2,
            53,
            "missing field 'min_score'",
        ),
        (
            "stages:\n  - {name: a, dialect: chat-json, model: m,\n"
            "     decide: {when: any_label, min_score: '0.9'}}\n"
            "  - {name: b, dialect: chat-json, model: m}\n",
            3,
            43,
            "'0.9' is not a number from 0 to 1",
        ),
        (
            "stages:\n  - {name: a, dialect: chat-json, model: m,\n"
            "     decide: {when: any_label, min_score: .nan}}\n"
            "  - {name: b, dialect: chat-json, model: m}\n",
            3,
            43,
            "nan is not from 0 to 1",
        ),
        (
            "stages:\n  - {name: a, dialect: chat-json, model: m,\n"
            "     decide: {when: any_label, min_score: -0.1}}\n"
            "  - {name: b, dialect: chat-json, model: m}\n",
            3,
            43,
            "-0.1 is not from 0 to 1",
        ),
        (
            "stages:\n  - {name: a, dialect: chat-json, model: m}\n"
            "  - {name: a, dialect: chat-json, model: m}\n",
            3,
            12,
            "duplicate stage name 'a' (first at line 2)",
        ),
        (
            "stages:\n  - {name: a, dialect: chat-json, model: m, url: x}\n",
            2,
            45,
            "comes from the environment, BACKFILL_MODEL_BASE_URL__A",
        ),
        (
            "stages:\n  - {name: a, dialect: chat-json, model: m, key: x}\n",
            2,
            45,
            "comes from the environment, BACKFILL_MODEL_API_KEY__A",
        ),
        (
            "api_key: x\nstages:\n  - {name: a, dialect: chat-json, model: m}\n",
            1,
            1,
            "comes from the environment, BACKFILL_MODEL_API_KEY__<STAGE>",
        ),
        (
            "stages:\n  - {name: a, dialect: chat-json, model: m, name: b}\n",
            2,
            45,
            "duplicate key 'name' in stages[0]",
        ),
    ],
)
def test_each_rule_is_one_problem_at_its_place(
    text: str, line: int, column: int, words: str
) -> None:
    assert one(text, words)[:2] == (line, column)


def test_more_than_eight_stages_is_a_problem_at_the_ninth() -> None:
    lines = ["stages:"]
    for i in range(9):
        lines.append(f"  - {{name: s{i}, dialect: chat-json, model: m,")
        lines.append("     decide: {when: none_label, min_score: 0.9}}")
    lines[-1] = "     }"
    text = "\n".join(lines) + "\n"
    assert one(text, "9 stages, more than 8")[:2] == (18, 5)
    eight = "\n".join([*lines[:15], "  - {name: s7, dialect: chat-json, model: m}"]) + "\n"
    assert len(parse_cascade(eight).stages) == 8


def test_the_stage_names_the_variables_of_its_endpoint_and_key() -> None:
    line, column, message = one(
        "stages:\n  - name: first-pass\n    dialect: chat-json\n    model: m\n"
        "    base_url: http://127.0.0.1:8000/v1\n",
        "base_url",
    )
    assert (line, column) == (5, 5)
    assert "endpoint comes from the environment, BACKFILL_MODEL_BASE_URL__FIRST_PASS" in message
    assert "127.0.0.1" not in message


def test_each_dialect_is_accepted_and_only_those() -> None:
    for dialect in DIALECTS:
        text = f"stages:\n  - {{name: a, dialect: {dialect}, model: m}}\n"
        assert parse_cascade(text).stages[0].dialect == dialect
    assert (
        "expected one of"
        in one("stages:\n  - {name: a, dialect: cascade, model: m}\n", "dialect")[2]
    )


# ------------------------------------------------------------------------------- decide rules

NONE = "ok"
SURE_NONE = Decide("none_label", 0.97)
SURE_ANY = Decide("any_label", 0.9)


@pytest.mark.parametrize(
    ("rule", "label", "score", "expected"),
    [
        (None, "spam", None, True),  # the last stage decides everything that reaches it
        (None, NONE, 0.0, True),
        (SURE_NONE, NONE, 0.97, True),  # at the threshold: decides
        (SURE_NONE, NONE, 0.969, False),
        (SURE_NONE, "spam", 0.99, False),  # a label that applies: not this rule's to decide
        (SURE_NONE, NONE, None, False),  # an unknown score never decides
        (SURE_ANY, "spam", 0.95, True),
        (SURE_ANY, NONE, 0.95, True),
        (SURE_ANY, "spam", 0.5, False),
        (SURE_ANY, "spam", None, False),
        (SURE_ANY, "spam", float("nan"), False),
        (Decide("any_label", 0.0), "spam", 0.0, True),
        (Decide("none_label", 1.0), NONE, 1.0, True),
    ],
)
def test_which_posts_a_stage_decides(
    rule: Decide | None, label: str, score: float | None, expected: bool
) -> None:
    assert decides(rule, label, score, NONE) is expected


@pytest.mark.parametrize(
    ("dialect", "p_label", "confidence", "expected"),
    [
        ("chat-json", 0.98, 0.5, 0.98),  # the wire's probability, not what the model says
        ("chat-json", None, 0.99, None),  # self-reported only: unknown
        ("safeguard", None, 0.99, None),
        ("llama-guard", 0.91, 0.91, 0.91),
        ("llama-guard", None, 1.0, None),
        ("openai-moderation", 0.95, 0.95, 0.95),  # a category decided: its score
        ("openai-moderation", None, 0.99, 0.99),  # the none label: 1 - the highest score
    ],
)
def test_a_stages_score(
    dialect: str, p_label: float | None, confidence: float, expected: float | None
) -> None:
    assert stage_score(dialect, p_label, confidence) == expected


def test_the_moderation_endpoints_none_label_decides_on_its_computed_confidence() -> None:
    # Nothing scored above 0.01: the none label, no p_label, confidence 0.99.
    score = stage_score("openai-moderation", None, 0.99)
    assert decides(SURE_NONE, NONE, score, NONE)
    # A chat model's self-reported 0.99 is no score: the post escalates.
    assert not decides(SURE_NONE, NONE, stage_score("chat-json", None, 0.99), NONE)


def test_a_rule_nobody_wrote_is_refused() -> None:
    with pytest.raises(ValueError, match="expected one of none_label, any_label"):
        decides(Decide("some_label", 0.5), NONE, 0.9, NONE)


# ---------------------------------------------------------------------------------- versions


def test_a_threshold_changes_the_routing_version_not_the_stage_version() -> None:
    base = parse_cascade(GOOD)
    assert re.fullmatch(r"[0-9a-f]{16}", base.routing_version())
    assert re.fullmatch(r"[0-9a-f]{16}", base.stage_version())
    moved = parse_cascade(GOOD.replace("min_score: 0.97", "min_score: 0.95"))
    assert moved.routing_version() != base.routing_version()
    assert moved.stage_version() == base.stage_version()
    when = parse_cascade(GOOD.replace("when: none_label", "when: any_label"))
    assert when.routing_version() != base.routing_version()
    assert when.stage_version() == base.stage_version()
    # Comments, layout and 1 written as 1.0 change nothing.
    same = parse_cascade(
        "# the forum's cascade\n" + GOOD.replace("min_score: 1\n", "min_score: 1.0\n")
    )
    assert (same.routing_version(), same.stage_version()) == (
        base.routing_version(),
        base.stage_version(),
    )


def test_a_model_changes_the_stage_version_not_the_routing_version() -> None:
    base = parse_cascade(GOOD)
    other = parse_cascade(GOOD.replace("gpt-4o-mini", "gpt-4.1-mini"))
    assert other.stage_version() != base.stage_version()
    assert other.routing_version() == base.routing_version()
    dialect = parse_cascade(GOOD.replace("dialect: chat-json", "dialect: safeguard"))
    assert dialect.stage_version() != base.stage_version()


# ------------------------------------------------------------------------- against a policy


def test_each_stages_dialect_must_be_usable_with_the_policy() -> None:
    cascade = parse_cascade(GOOD)
    assert cascade_problems(cascade, load_policy(FORUM)) == []
    # The built-in policy has neither a moderation section nor rules (Llama Guard's categories).
    found = [(p.line, p.message) for p in cascade_problems(cascade, builtin_policy())]
    assert [line for line, _ in found] == [2, 6]
    assert "stage 'screen' (openai-moderation)" in found[0][1]
    assert "dialects: openai-moderation: section" in found[0][1]
    assert "stage 'first-pass' (llama-guard)" in found[1][1] and "no rules" in found[1][1]


def test_each_dialect_is_checked_with_the_settings_default_variant() -> None:
    defaults = ModelSettings.model_fields
    settings_defaults = {
        "llama-guard": defaults["llama_guard_version"].default,
        "safeguard": defaults["reasoning_effort"].default,
    }
    assert settings_defaults == DEFAULT_VARIANTS


# ---------------------------------------------------------------------------- hostile files


def test_a_file_too_large_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    big = "# " + "x" * MAX_CASCADE_BYTES + "\n"
    assert one(big, "larger than")[:2] == (1, 1)
    path = tmp_path / "big.yaml"
    path.write_text(big)
    with pytest.raises(CascadeInvalid, match="larger than 1048576 bytes"):
        load_cascade(path)


def test_binary_and_missing_files_are_one_problem(tmp_path: Path) -> None:
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"stages:\n  - name: \xff\xfe\x00\x01\n")
    with pytest.raises(CascadeInvalid) as exc:
        load_cascade(path)
    assert [(p.line, p.message) for p in exc.value.problems] == [(2, "not valid UTF-8")]
    with pytest.raises(CascadeInvalid) as exc:
        load_cascade(tmp_path / "nope.yaml")
    assert "cannot read" in exc.value.problems[0].message
    with pytest.raises(CascadeInvalid) as exc:
        load_cascade(tmp_path)
    assert "cannot read" in exc.value.problems[0].message
    path.write_bytes("\ufeff".encode() + GOOD.encode())
    assert len(load_cascade(path).stages) == 3  # a byte-order mark is not text


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "the file is empty"),
        ("# only a comment\n", "the file is empty"),
        ("stages: [\n", "YAML syntax"),
        ("stages:\n  - name: a\x00\n", "U+0000 is not allowed"),
        ("[" * 100_000 + "]" * 100_000, "YAML"),
        ("stages: " + "[" * 5_000 + "]" * 5_000 + "\n", "YAML nodes"),
        (
            "a: &a ["
            + ", ".join(["x"] * 50)
            + "]\n"
            + "".join(
                f"b{i}: &b{i} [" + ", ".join([f"*{'a' if i == 0 else f'b{i - 1}'}"] * 50) + "]\n"
                for i in range(4)
            ),
            "YAML nodes",
        ),
        ("stages: !!python/object:os.system echo\n", "YAML"),
        (
            "stages:\n  - {name: a, dialect: chat-json, model: m, decide: {min_score: "
            + "9" * 5000
            + "}}\n",
            "not a number YAML can read",
        ),
    ],
)
def test_hostile_text_is_a_problem_never_a_traceback(text: str, words: str) -> None:
    started = time.monotonic()
    found = problems(text)
    assert any(words in message for _, _, message in found), found
    assert all(len(message) < 400 for _, _, message in found)
    assert time.monotonic() - started < 30
