"""The label's probability from a chat answer's token log-probabilities, and from the
moderation endpoint's deciding score (pure): known where the wire says, never invented."""

from __future__ import annotations

import json
import math

import pytest

from backfill_assets.domain.policy.dialect_sections import MODERATION_CATEGORIES
from backfill_assets.domain.policy.file import parse_policy
from backfill_assets.domain.policy.label_probability import label_probability
from backfill_assets.domain.policy.rubric import Rubric
from backfill_tests.domain.test_moderation_dialect import BASE, MAPPING

ANSWER = (
    '{"schema_version":1,"correlation_id":"k","label":"abuse","rule_ids":["A1"],"confidence":0.9}'
)


def _tokens(text: str, label_lps: list[float], split: list[str]) -> list[tuple[str, float]]:
    """``text`` cut at the pieces of ``split`` (the label's tokens get ``label_lps``)."""
    head, tail = text.split('"abuse"', 1)
    out = [(head + '"', math.log(0.999))]
    out += list(zip(split, label_lps, strict=True))
    out.append(('"' + tail, math.log(0.99)))
    return out


def test_the_labels_tokens_multiply() -> None:
    tokens = _tokens(ANSWER, [math.log(0.8), math.log(0.5)], ["ab", "use"])
    assert label_probability(ANSWER, "abuse", tokens) == pytest.approx(0.4)


def test_a_token_that_straddles_the_value_counts_for_it() -> None:
    head, tail = ANSWER.split("abuse", 1)
    tokens = [(head[:-1], -0.01), ('"ab', math.log(0.6)), ("use", math.log(0.5)), (tail, -0.02)]
    assert label_probability(ANSWER, "abuse", tokens) == pytest.approx(0.3)


@pytest.mark.parametrize(
    "tokens",
    [
        None,
        [],
        [("something else", -0.1)],  # not this answer's tokens
        [(ANSWER[:10], -0.1), (ANSWER[10:], 0.5)],  # a positive log-probability
        [(ANSWER[:10], -0.1), (ANSWER[10:], float("nan"))],
        [(ANSWER[:10], -0.1), (ANSWER[10:], float("-inf"))],
    ],
)
def test_nothing_is_invented(tokens: list[tuple[str, float]] | None) -> None:
    assert label_probability(ANSWER, "abuse", tokens) is None


def test_a_label_named_twice_is_not_guessed() -> None:
    twice = ANSWER[:-1] + ',"x":{"label":"abuse"}}'
    assert label_probability(twice, "abuse", [(twice, -0.1)]) is None


def test_the_rubric_reads_the_chat_probability_beside_the_answer() -> None:
    rubric = Rubric(parse_policy(BASE))
    raw = ANSWER.replace('"k"', '"key1"')
    tokens = _tokens(raw, [math.log(0.7)], ["abuse"])
    out, p = rubric.read(raw, "key1", tokens)
    assert out.label == "abuse" and p == pytest.approx(0.7)
    assert rubric.read(raw, "key1")[1] is None


def test_the_moderation_endpoints_deciding_score_is_the_labels_probability() -> None:
    rubric = Rubric(parse_policy(BASE + MAPPING), "openai-moderation")
    scores = dict.fromkeys(MODERATION_CATEGORIES, 0.01) | {"violence": 0.8, "harassment": 0.6}
    out, p = rubric.read(json.dumps({"category_scores": scores}), "k")
    assert out.label == "threat" and p == 0.8
    calm = dict.fromkeys(MODERATION_CATEGORIES, 0.01)
    out, p = rubric.read(json.dumps({"category_scores": calm}), "k")
    assert out.label == "ok" and p is None  # no category decides "none"
