"""The ``openai-moderation`` dialect's mapping onto the policy: the ``dialects:`` section, its
checks with line numbers, the label a result takes, and the keys it names (pure)."""

from __future__ import annotations

import json

import pytest

from backfill_assets.domain.policy.dialect_sections import MODERATION_CATEGORIES
from backfill_assets.domain.policy.file import PolicyInvalid, parse_policy
from backfill_assets.domain.policy.output_gate import OutputRejected
from backfill_assets.domain.policy.rubric import Rubric

BASE = """\
id: forum
version: "3"
instructions: Classify the post.
labels:
  - id: threat
    description: Threats of violence.
    action: hide
    severity: 90
  - id: abuse
    description: Harassment and hate.
    action: hide
    severity: 50
  - id: ok
    description: Nothing applies.
    action: none
rules:
  - id: T1
    label: threat
    description: A threat to hurt someone.
  - id: A1
    label: abuse
    description: Insults.
  - id: A2
    label: abuse
    description: Hate.
"""
MAPPING = """\
dialects:
  openai-moderation:
    categories:
      violence: {label: threat, rule: T1, threshold: 0.5}
      harassment: {label: abuse, rule: A1, threshold: 0.4}
      hate: {label: abuse, rule: A2, threshold: 0.4}
"""


def _rubric(mapping: str = MAPPING) -> Rubric:
    return Rubric(parse_policy(BASE + mapping), "openai-moderation")


def _result(**scores: object) -> str:
    full: dict[str, object] = dict.fromkeys(MODERATION_CATEGORIES, 0.001)
    full.update({k.replace("_", "/").replace("self/", "self-"): v for k, v in scores.items()})
    return json.dumps({"flagged": True, "categories": {}, "category_scores": full})


def test_the_highest_category_over_threshold_decides_with_its_labels_rules() -> None:
    rubric = _rubric()
    out = rubric.parse(_result(harassment=0.9, hate=0.5, violence=0.3), "k1")
    assert (out.label, out.rule_ids, out.confidence) == ("abuse", ("A1", "A2"), 0.9)
    # The rules of a category over threshold that leads elsewhere are not the label's.
    out = rubric.parse(_result(harassment=0.45, violence=0.8), "k1")
    assert (out.label, out.rule_ids, out.confidence) == ("threat", ("T1",), 0.8)
    assert out.correlation_id == "k1"


def test_equal_scores_go_to_the_label_of_higher_severity() -> None:
    out = _rubric().parse(_result(harassment=0.7, violence=0.7), "k")
    assert out.label == "threat"


def test_nothing_over_threshold_is_the_none_label() -> None:
    out = _rubric().parse(_result(harassment=0.39, violence=0.49, sexual=0.99), "k")
    # sexual is not mapped: ignored; confidence is how far the highest mapped score stayed.
    assert (out.label, out.rule_ids) == ("ok", ())
    assert out.confidence == pytest.approx(1 - 0.49)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("not json", "not JSON"),
        (json.dumps({"scores": {"violence": 0.9}}), "no category_scores"),
        (json.dumps({"category_scores": {"violence": 0.9}}), "no score for category 'harassment'"),
        (_result(violence=1.7), "not in [0, 1]"),
        (_result(violence=True), "no score"),
        (_result(violence="0.9"), "no score"),
        (_result(violence=float("nan")), "not in [0, 1]"),
    ],
)
def test_a_result_the_mapping_cannot_read_is_refused(raw: str, why: str) -> None:
    with pytest.raises(OutputRejected, match=why.replace("[", r"\[").replace("]", r"\]")):
        _rubric().parse(raw, "k")


def test_the_section_names_how_answers_are_read_never_the_work() -> None:
    chat_plain = Rubric(parse_policy(BASE))
    chat_mapped = Rubric(parse_policy(BASE + MAPPING))
    assert chat_plain.key_version == chat_mapped.key_version
    assert chat_mapped.policy.mapping_version == ""  # chat-json never reads the section
    moved = MAPPING.replace("threshold: 0.5", "threshold: 0.6")
    # Not sent to the endpoint: the same keys, another mapping (re-labelled without a call).
    assert _rubric().key_version == _rubric(moved).key_version
    assert _rubric().policy.mapping_version != _rubric(moved).policy.mapping_version
    assert _rubric() != _rubric(moved)
    assert _rubric().key_version == chat_plain.key_version + "+openai-moderation"
    # The moderation endpoint is sent the text alone.
    assert _rubric().messages("k", "hello <post>") == [{"role": "user", "content": "hello <post>"}]
    assert _rubric().schema_bytes == 0


def test_the_dialect_needs_its_section() -> None:
    with pytest.raises(ValueError, match="no dialects: openai-moderation: section"):
        Rubric(parse_policy(BASE), "openai-moderation")
    with pytest.raises(ValueError, match="expected one of"):
        Rubric(parse_policy(BASE), "llama-guardian")


@pytest.mark.parametrize(
    ("edit", "line", "message"),
    [
        (("violence:", "violins:"), 29, "unknown category 'violins'"),
        (("label: threat", "label: threats"), 29, "unknown label 'threats'"),
        (("rule: A2", "rule: A9"), 31, "unknown rule 'A9'"),
        (("rule: T1", "rule: A1"), 29, "rule 'A1' leads to 'abuse', not to 'threat'"),
        (("threshold: 0.5", "threshold: 1.5"), 29, "less than or equal to 1"),
        (("threshold: 0.5", "threshold: yes"), 29, "threshold"),
        (("{label: threat, rule: T1, threshold: 0.5}", "{label: threat}"), 29, "threshold"),
    ],
)
def test_policy_check_names_the_line_of_a_bad_mapping(
    edit: tuple[str, str], line: int, message: str
) -> None:
    with pytest.raises(PolicyInvalid) as caught:
        parse_policy(BASE + MAPPING.replace(*edit), "forum.yaml")
    text = str(caught.value)
    assert message in text, text
    assert f"forum.yaml:{line}:" in text, text
