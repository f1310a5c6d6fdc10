"""The evaluation's figures against hand computation, and the gold-set reader."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from backfill_assets.domain.policy.evaluation import NO_LABEL, Gate, compare, figures, wilson
from backfill_assets.ingest.gold import GoldError, read_gold


def test_wilson_matches_the_textbook_values() -> None:
    # 8 of 10 at 95%: 0.4902 .. 0.9433 (Wilson 1927; e.g. Newcombe 1998, table I).
    low, high = wilson(8, 10) or (0, 0)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    assert wilson(0, 0) is None
    assert wilson(0, 5) is not None and wilson(0, 5)[0] == 0.0  # type: ignore[index]


def test_figures_equal_a_confusion_matrix_computed_by_hand() -> None:
    expected = ["a"] * 5 + ["b"] * 3 + ["c"] * 2
    predicted: list[str | None] = ["a", "a", "a", "b", None, "b", "b", "a", "c", "a"]
    outcomes = ["accepted"] * 4 + ["schema_rejected"] + ["accepted"] * 5
    fig = figures(expected, predicted, ["a", "b", "c"], outcomes)
    assert fig.confusion == {
        "a": {"a": 3, "b": 1, "c": 0, NO_LABEL: 1},
        "b": {"a": 1, "b": 2, "c": 0, NO_LABEL: 0},
        "c": {"a": 1, "b": 0, "c": 1, NO_LABEL: 0},
    }
    by = {f.label: f for f in fig.per_label}
    # a: tp 3, predicted 5 (3 + 1 + 1), support 5; b: tp 2, predicted 3, support 3; c: 1/1, 1/2.
    assert (by["a"].precision, by["a"].recall) == (3 / 5, 3 / 5)
    assert (by["b"].precision, by["b"].recall) == (2 / 3, 2 / 3)
    assert (by["c"].precision, by["c"].recall) == (1.0, 0.5)
    assert by["c"].f1 == pytest.approx(2 * 1.0 * 0.5 / 1.5)
    assert by["a"].precision_ci == wilson(3, 5) and by["c"].recall_ci == wilson(1, 2)
    assert fig.accuracy == 6 / 10
    assert fig.macro_f1 == pytest.approx((0.6 + 2 / 3 + 2 / 3) / 3)
    assert fig.schema_rejected_share == 0.1 and fig.unlabelled == {"schema_rejected": 1}


def test_labels_never_said_or_never_expected_are_undefined_not_perfect() -> None:
    fig = figures(["a", "a"], ["b", "b"], ["a", "b", "c"])
    by = {f.label: f for f in fig.per_label}
    assert by["a"].precision is None and by["a"].recall == 0.0 and by["a"].f1 == 0.0
    assert by["b"].recall is None and by["b"].precision == 0.0
    assert by["c"].support == by["c"].predicted == 0
    assert fig.macro_f1 == 0.0  # over a and b only: c never appears


def test_agreement_kappa_and_transitions() -> None:
    a: list[str | None] = ["x", "x", "y", "y", "y", None]
    b: list[str | None] = ["x", "y", "y", "y", "x", "x"]
    got = compare(a, b)
    assert got.transitions == {"x": {"x": 1, "y": 1}, "y": {"y": 2, "x": 1}, NO_LABEL: {"x": 1}}
    assert sum(n for row in got.transitions.values() for n in row.values()) == 6
    assert got.agreement == 3 / 6
    # Chance: A says x 2/6, y 3/6, none 1/6; B says x 3/6, y 3/6.
    chance = (2 / 6) * (3 / 6) + (3 / 6) * (3 / 6)
    assert got.kappa == pytest.approx((0.5 - chance) / (1 - chance))
    assert compare(["x"] * 3, ["x"] * 3).kappa == 1.0
    assert math.isclose(compare(["x", "y"], ["y", "x"]).kappa or 0, -1.0)


def test_gold_sets_follow_the_rules_posts_follow(tmp_path: Path) -> None:
    text = "a post text that must never be echoed"
    rows = [
        {"id": "g1", "text": text, "label": "ok"},
        {"id": "g2", "text": "x", "label": "not a label!"},
        {"id": "g1", "text": "again", "label": "ok"},
        {"id": "", "text": "x", "label": "ok"},
        {"id": "g5", "text": "nul\x00", "label": "ok"},
        {"id": "g6", "text": "x" * 40_000, "label": "ok"},
        {"id": "g7", "text": "fine", "label": "spam", "rule": "S-1"},
        {"id": "g8", "text": "fine", "label": "ok", "colour": "red"},
        {"id": "g9", "label": "ok"},
    ]
    jsonl = tmp_path / "gold.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n{broken\n")
    gold = read_gold(jsonl, "eval")
    assert [(r.post.post_id, r.label, r.rule) for r in gold.rows] == [
        ("g1", "ok", None),
        ("g7", "spam", "S-1"),
    ]
    reasons = {r.line: r.reason for r in gold.rejected}
    assert sorted(reasons) == [2, 3, 4, 5, 6, 8, 9, 10]
    assert "label" in reasons[2] and "duplicate id" in reasons[3] and "empty" in reasons[4]
    assert "NUL" in reasons[5] and "larger than" in reasons[6] and "colour" in reasons[8]
    assert "text" in reasons[9] and "invalid JSON" in reasons[10]
    assert not any(text in r for r in reasons.values())
    assert gold.rows[0].post.tenant_id == "eval"

    csv_file = tmp_path / "gold.csv"
    csv_file.write_text(
        'id,text,label,rule\nc1,"commas, ""quotes""\nand lines",ok,\nc2,,spam,S-1\n'
    )
    got = read_gold(csv_file, "eval")
    assert [r.post.text for r in got.rows] == ['commas, "quotes"\nand lines', ""]
    with pytest.raises(GoldError, match="header"):
        (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
        read_gold(tmp_path / "bad.csv", "eval")
    with pytest.raises(GoldError, match="no usable rows"):
        (tmp_path / "empty.jsonl").write_text("\n")
        read_gold(tmp_path / "empty.jsonl", "eval")


def test_the_gate_names_every_label_with_too_few_gold_rows() -> None:
    gate = Gate(min_macro_f1=0.9, min_support=5)
    support = {"spam": 9, "ok": 5, "abuse": 4}
    assert gate.thin_labels(["spam", "abuse", "ok", "needs_review"], support) == [
        ("abuse", 4),
        ("needs_review", 0),
    ]
    assert Gate(0.9, 1).thin_labels(["spam"], {"spam": 1}) == []
