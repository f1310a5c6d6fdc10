"""A previous classifier's scores read onto the policy's labels by threshold: bands, the
highest score deciding, ties by severity then the policy's order, the three shapes of scores,
and the refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from backfill_assets.domain.people.baseline_map import (
    Band,
    MappingError,
    MappingInvalid,
    ScoreMap,
    label_for,
    parse_threshold,
    read_mapping,
    row_scores,
    score_map,
)
from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.policy.file import builtin_policy
from backfill_tests.policy_helpers import course

DEFAULT = builtin_policy()


def _map(*specs: str, policy: Policy = DEFAULT) -> ScoreMap:
    found = score_map([parse_threshold(s) for s in specs], policy)
    assert found is not None
    return found


def test_the_highest_score_over_its_band_decides_else_the_none_label() -> None:
    smap = _map("TOXICITY=abuse:0.8", "TOXICITY=needs_review:0.5", "SPAM=spam:0.7")
    assert label_for({"TOXICITY": 0.9}, smap, DEFAULT) == "abuse"
    # 0.6: under abuse's band, in needs_review's; SPAM 0.75 is higher and over its own.
    assert label_for({"TOXICITY": 0.6}, smap, DEFAULT) == "needs_review"
    assert label_for({"TOXICITY": 0.6, "SPAM": 0.75}, smap, DEFAULT) == "spam"
    assert label_for({"TOXICITY": 0.49, "SPAM": 0.69}, smap, DEFAULT) == "ok"
    assert label_for({"OTHER": 1.0}, smap, DEFAULT) == "ok"


def test_equal_scores_go_to_severity_then_to_the_policy_order() -> None:
    policy = course("5")  # solution_leak (severity 3) is listed before contract_cheating (4)
    smap = _map("A=solution_leak:0.5", "B=contract_cheating:0.5", policy=policy)
    assert label_for({"A": 0.9, "B": 0.9}, smap, policy) == "contract_cheating"
    assert label_for({"A": 0.91, "B": 0.9}, smap, policy) == "solution_leak"
    # The built-in policy has no severities: spam is listed before abuse.
    smap = _map("TOXICITY=abuse:0.5", "SPAM=spam:0.5")
    assert label_for({"TOXICITY": 0.8, "SPAM": 0.8}, smap, DEFAULT) == "spam"


def test_scores_in_columns_an_object_or_perspectives_response() -> None:
    smap = _map("TOXICITY=abuse:0.8")
    nested = {"TOXICITY": {"summaryScore": {"value": 0.91, "type": "PROBABILITY"}}}
    assert row_scores({"attributeScores": nested}, "scores", smap) == {"TOXICITY": 0.91}
    assert row_scores({"scores": '{"TOXICITY": 0.2}'}, "scores", smap) == {"TOXICITY": 0.2}
    assert row_scores({"TOXICITY": "0.3", "x": 5}, "scores", smap) == {"TOXICITY": 0.3}
    for values, says in (
        ({"TOXICITY": "high"}, "not a number in [0, 1]"),
        ({"TOXICITY": True}, "not a number in [0, 1]"),
        ({"scores": {"TOXICITY": 0.5, "INSULT": -0.1}}, "'INSULT' is not a number in [0, 1]"),
        ({"scores": {"TOXICITY": float("nan")}}, "not a number in [0, 1]"),
        ({"attributeScores": {"TOXICITY": {"spanScores": []}}}, "no summaryScore.value"),
        ({"scores": {"INSULT": 0.5}}, "no score for any mapped attribute"),
        ({"scores": "[1]"}, "must be an object"),
    ):
        with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
            row_scores(values, "scores", smap)


def test_bands_are_checked_against_the_policy() -> None:
    assert parse_threshold("TOXICITY=abuse:0.8") == Band("TOXICITY", "abuse", 0.8)
    for spec, says in (
        ("TOXICITY=abuse", "expected ATTRIBUTE=LABEL:THRESHOLD"),
        ("TOXICITY=abuse:0", r"in \(0, 1\]"),
        ("TOXICITY=abuse:x", r"in \(0, 1\]"),
        ("TOX ICITY=abuse:0.5", "must match"),
    ):
        with pytest.raises(MappingError, match=says):
            parse_threshold(spec)
    for specs, says in (
        (["TOXICITY=bogus:0.5"], "not in policy default@1"),
        (["TOXICITY=ok:0.5"], "none label"),
        (["TOXICITY=abuse:0.5", "TOXICITY=abuse:0.7"], "two thresholds"),
    ):
        with pytest.raises(MappingError, match=says):
            score_map([parse_threshold(s) for s in specs], DEFAULT)
    assert score_map([], DEFAULT) is None


def test_a_mapping_file_and_its_problems_with_their_lines(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "attributes:\n  TOXICITY: {abuse: 0.8, needs_review: 0.5}\n  THREAT:\n    abuse: 0.6\n"
    )
    assert read_mapping(str(good)) == [
        Band("TOXICITY", "abuse", 0.8),
        Band("TOXICITY", "needs_review", 0.5),
        Band("THREAT", "abuse", 0.6),
    ]
    bad = tmp_path / "bad.yaml"
    bad.write_text("attributes:\n  TOXICITY: {abuse: 2}\n  THREAT: 0.5\n")
    with pytest.raises(MappingInvalid) as got:
        read_mapping(str(bad))
    assert [(p.line, p.message.split(":")[0]) for p in got.value.problems] == [
        (2, "TOXICITY=abuse"),
        (3, "THREAT"),
    ]
