"""Calibration figures against hand computation: bins, ECE, the PR table, the score's source."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_assets.domain.policy.calibration import (
    THRESHOLDS,
    bin_of,
    calibration,
    label_score,
    pr_curve,
    reliability,
)


def test_the_score_is_p_label_when_the_row_has_one_else_the_confidence() -> None:
    assert label_score(None, 0.7) == (0.7, "confidence")
    assert label_score(0.2, 0.7) == (0.2, "p_label")
    assert label_score(0.0, 0.7) == (0.0, "p_label")  # 0.0 is a probability, not a missing one


def test_bin_edges_put_0_in_the_first_bin_1_in_the_last_and_an_edge_in_the_bin_above() -> None:
    assert bin_of(0.0) == 0 and bin_of(0.0999) == 0
    assert bin_of(1.0) == 9 and bin_of(0.95) == 9 and bin_of(0.9) == 9
    # An edge is the lower bound of its bin, whatever the float arithmetic of score * 10.
    assert [bin_of(i / 10) for i in range(10)] == list(range(10))
    assert bin_of(0.3) == 3 and bin_of(0.7) == 7 and bin_of(0.29999) == 2
    with pytest.raises(ValueError, match="outside"):
        bin_of(1.0001)
    with pytest.raises(ValueError, match="outside"):
        bin_of(-0.01)


def test_a_perfectly_calibrated_set_has_ece_0() -> None:
    # 0.25 right once in four, 0.75 right three times in four.
    got = reliability([0.25] * 4 + [0.75] * 4, [True, False, False, False, True, True, True, False])
    assert got.ece == pytest.approx(0.0)
    assert [(b.count, b.accuracy) for b in got.bins if b.count] == [(4, 0.25), (4, 0.75)]


def test_ece_of_a_known_set_equals_the_hand_value() -> None:
    # bin 9: 0.95, 0.95, one right: |0.5 - 0.95| * 2/4 = 0.225
    # bin 6: 0.65 right: |1 - 0.65| * 1/4 = 0.0875; bin 1: 0.15 wrong: |0 - 0.15| * 1/4 = 0.0375
    got = reliability([0.95, 0.95, 0.65, 0.15], [True, False, True, False])
    assert got.ece == pytest.approx(0.35)
    assert got.rows == 4 and len(got.bins) == 10
    last = got.bins[9]
    assert (last.lower, last.upper, last.count) == (0.9, 1.0, 2)
    assert last.mean_score == pytest.approx(0.95) and last.accuracy == 0.5
    first = got.bins[0]
    assert (first.count, first.mean_score, first.accuracy) == (0, None, None)


def test_no_scores_no_ece() -> None:
    got = reliability([], [])
    assert got.ece is None and got.rows == 0


def test_pr_above_every_score_has_recall_0_and_no_precision() -> None:
    got = pr_curve([0.9, 0.4, None], [True, False, True], positives=2, thresholds=[0.0, 0.5, 0.95])
    assert got.predicted == (2, 1, 0)
    assert got.true_positives == (1, 1, 0)
    assert got.precision == (0.5, 1.0, None)
    assert got.recall == (0.5, 0.5, 0.0)
    assert pr_curve([0.5], [False], positives=0, thresholds=[0.1]).recall == (None,)


@given(st.lists(st.tuples(st.one_of(st.none(), st.floats(0.0, 1.0)), st.booleans()), max_size=40))
def test_pr_counts_equal_a_row_by_row_count(rows: list[tuple[float | None, bool]]) -> None:
    got = pr_curve([s for s, _ in rows], [h for _, h in rows], positives=len(rows))
    for i, t in enumerate(THRESHOLDS):
        above = [h for s, h in rows if s is not None and s >= t]
        assert (got.predicted[i], got.true_positives[i]) == (len(above), sum(above))


def test_the_threshold_grid_is_0_to_1_by_hundredths() -> None:
    assert len(THRESHOLDS) == 101 and THRESHOLDS[0] == 0.0 and THRESHOLDS[-1] == 1.0
    assert THRESHOLDS[37] == 0.37
    # A score on the grid is predicted at its own threshold.
    assert pr_curve([0.37], [True], 1).predicted[37] == 1


def test_calibration_overall_and_per_label_by_hand() -> None:
    expected = ["a", "a", "b", "b", "a"]
    predicted: list[str | None] = ["a", "b", "b", None, "a"]
    scores: list[float | None] = [0.9, 0.6, 0.8, None, 0.4]
    got = calibration(expected, predicted, scores, ["a", "b", "c"], ["confidence"] * 4 + [None])
    assert got.score == "confidence" and got.rows == 5 and got.overall.rows == 4
    # Overall (right: a, b, a; wrong: the b given to an a): bins 9, 6, 8, 4:
    # 0.1/4 + 0.6/4 + 0.2/4 + 0.6/4 = 0.375.
    assert got.overall.ece == pytest.approx(0.375)
    # Micro PR at 0.5: 0.9, 0.6, 0.8 predicted, 2 right, of 5 gold rows.
    at = THRESHOLDS.index(0.5)
    assert got.overall_pr.predicted[at] == 3 and got.overall_pr.true_positives[at] == 2
    assert got.overall_pr.precision[at] == pytest.approx(2 / 3)
    assert got.overall_pr.recall[at] == pytest.approx(2 / 5)
    by = {c.label: c for c in got.per_label}
    assert list(by) == ["a", "b", "c"]
    # a: given to 0.9 and 0.4 (both gold a); 3 gold a rows.
    assert by["a"].reliability.rows == 2
    assert by["a"].reliability.ece == pytest.approx((0.1 + 0.6) / 2)
    assert (by["a"].pr.predicted[0], by["a"].pr.recall[0]) == (2, pytest.approx(2 / 3))
    assert (by["a"].pr.precision[at], by["a"].pr.recall[at]) == (1.0, pytest.approx(1 / 3))
    # b: given to 0.6 (gold a, wrong) and 0.8 (gold b); the unlabelled gold b is a positive
    # never predicted.
    assert by["b"].reliability.ece == pytest.approx(0.5 * 0.6 + 0.5 * 0.2)
    at7 = THRESHOLDS.index(0.7)
    assert (by["b"].pr.positives, by["b"].pr.predicted[at7], by["b"].pr.recall[at7]) == (2, 1, 0.5)
    assert by["b"].pr.precision[0] == 0.5 and by["b"].pr.recall[-1] == 0.0
    # c: never given, never gold.
    assert by["c"].reliability.ece is None and by["c"].pr.recall[0] is None
    assert by["c"].pr.precision[0] is None


def test_the_json_form_names_the_source_and_shares_the_thresholds() -> None:
    got = calibration(["a", "b"], ["a", "a"], [0.9, 0.7], ["a", "b"], ["p_label", "confidence"])
    doc = got.as_dict()
    assert doc["score"] == "mixed" and doc["bins"] == 10 and len(doc["thresholds"]) == 101
    assert doc["rows"] == 2 and doc["scored_rows"] == 2
    # 0.9 right, 0.7 wrong: |1 - 0.9| / 2 + |0 - 0.7| / 2.
    assert doc["overall"]["ece"] == pytest.approx(0.4)
    assert [b["count"] for b in doc["overall"]["reliability"]] == [0] * 7 + [1, 0, 1]
    [a, b] = doc["labels"]
    assert a["label"] == "a" and a["rows"] == 2 and len(a["pr"]["precision"]) == 101
    assert b["rows"] == 0 and b["ece"] is None and b["pr"]["positives"] == 1
    only = calibration(["a"], ["a"], [0.5], ["a"], ["p_label"]).as_dict()
    assert only["score"] == "p_label"


def test_a_label_without_a_score_is_refused() -> None:
    with pytest.raises(ValueError, match="without a score"):
        calibration(["a"], ["a"], [None], ["a"])
    with pytest.raises(ValueError, match="differ in length"):
        calibration(["a", "b"], ["a"], [0.5], ["a"])
