"""Agreement between the model and moderators (domain/policy/agreement.py) against hand
computation: observed agreement, Cohen's kappa with the Fleiss-Cohen-Everitt standard error,
and each label's positive agreement."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from backfill_assets.domain.policy.agreement import agreement, cohen_kappa
from backfill_assets.domain.policy.evaluation import Z95, compare, wilson

# model x moderator, 100 posts:
#            human yes  human no
# model yes      20         5      (25)
# model no       10        65      (75)
#               (30)      (70)
# p_o = 85/100 = 0.85; p_e = .25 * .30 + .75 * .70 = .075 + .525 = 0.6;
# kappa = (.85 - .6) / (1 - .6) = 0.625.
# Fleiss, Cohen & Everitt (1969), 1 - kappa = .375:
# A = .20 (1 - (.25 + .30) .375)^2 + .65 (1 - (.75 + .70) .375)^2
#   = .20 * .79375^2 + .65 * .45625^2 = .1260078125 + .135306640625 = .261314453125
# B = .375^2 (.05 (.30 + .75)^2 + .10 (.70 + .25)^2) = .140625 * (.055125 + .09025)
#   = .020443359375
# C = (.625 - .6 * .375)^2 = .4^2 = .16
# var = (A + B - C) / (100 (1 - .6)^2) = .1217578125 / 16 = .00760986328125; se = .0872345
TWO_BY_TWO = {("yes", "yes"): 20, ("yes", "no"): 5, ("no", "yes"): 10, ("no", "no"): 65}
HAND_SE = math.sqrt(0.1217578125 / 16)


def test_kappa_and_its_interval_equal_the_hand_computation() -> None:
    k = cohen_kappa(TWO_BY_TWO)
    assert k.value == pytest.approx(0.625)
    assert k.se == pytest.approx(HAND_SE) and round(HAND_SE, 5) == 0.08723
    assert k.ci == pytest.approx((0.625 - Z95 * HAND_SE, 0.625 + Z95 * HAND_SE))
    got = agreement(TWO_BY_TWO)
    assert (got.posts, got.agreed, got.observed) == (100, 85, 0.85)
    assert got.observed_ci == wilson(85, 100)
    by = {x.label: x for x in got.per_label}
    # yes: a = 20, b = 5 (model only), c = 10 (moderator only): 2a / (2a + b + c) = 40 / 55.
    assert by["yes"].positive_agreement == pytest.approx(40 / 55)
    assert by["no"].positive_agreement == pytest.approx(130 / 145)
    # With two labels, each label against the rest is the whole table.
    assert by["yes"].kappa.value == pytest.approx(0.625)
    assert by["no"].kappa.se == pytest.approx(HAND_SE)


def test_three_labels_by_hand_and_as_compare_counts_them() -> None:
    pairs = {
        ("spam", "spam"): 8,
        ("spam", "ok"): 2,
        ("ok", "spam"): 1,
        ("ok", "ok"): 25,
        ("abuse", "abuse"): 3,
        ("abuse", "ok"): 1,
    }
    got = agreement(pairs)
    # 36 of 40 agree; model shares spam 10, ok 26, abuse 4; moderators' 9, 28, 3:
    # p_e = (10*9 + 26*28 + 4*3) / 1600 = 830 / 1600; kappa = (.9 - .51875) / .48125 = 61/77.
    assert got.observed == 0.9 and got.kappa.value == pytest.approx(61 / 77)
    rows = [pair for pair, n in pairs.items() for _ in range(n)]
    same = compare([m for m, _h in rows], [h for _m, h in rows])
    assert same.agreement == got.observed and same.kappa == pytest.approx(got.kappa.value)
    by = {x.label: x for x in got.per_label}
    assert [x.label for x in got.per_label] == ["abuse", "ok", "spam"]
    assert (by["spam"].model, by["spam"].human, by["spam"].both) == (10, 9, 8)
    assert by["spam"].positive_agreement == pytest.approx(16 / 19)
    assert by["abuse"].positive_agreement == pytest.approx(6 / 7)
    # abuse against the rest: 3 both, 1 model only, 36 neither: p_o = 39/40,
    # p_e = (4 * 3 + 36 * 37) / 1600 = 1344 / 1600; kappa = (.975 - .84) / .16 = 0.84375.
    assert by["abuse"].kappa.value == pytest.approx(0.84375)
    assert got.as_dict()["labels"][0]["kappa_ci95"][1] == 1.0  # clipped


def test_the_standard_error_is_the_spread_of_kappa_over_samples() -> None:
    # Draw 2,000 tables of 400 posts from the table's shares (fixed seed): the spread of their
    # kappas is the large-sample standard error within a few percent.
    cells = [("s", "s"), ("s", "o"), ("o", "s"), ("o", "o"), ("a", "a"), ("a", "o")]
    weights = [8, 2, 1, 25, 3, 1]
    rng = random.Random(7)
    kappas = []
    for _ in range(2000):
        table: dict[tuple[str, str], int] = {}
        for cell in rng.choices(cells, weights=weights, k=400):
            table[cell] = table.get(cell, 0) + 1
        kappas.append(cohen_kappa(table).value or 0.0)
    expected = cohen_kappa({c: w * 10 for c, w in zip(cells, weights, strict=True)}).se
    assert expected is not None
    assert statistics.stdev(kappas) == pytest.approx(expected, rel=0.08)


def test_edges_no_posts_one_label_and_perfect_disagreement() -> None:
    none = agreement({})
    assert none.posts == 0 and none.observed is None and none.kappa.value is None
    assert none.observed_ci is None and none.per_label == ()
    # Every post one label on both sides: chance agreement is certain.
    one = agreement({("ok", "ok"): 12})
    assert one.kappa.value == 1.0 and one.kappa.ci is None
    # Always the other label: kappa -1, well below any threshold.
    flip = agreement({("a", "b"): 5, ("b", "a"): 5})
    assert flip.observed == 0.0 and flip.kappa.value == pytest.approx(-1.0)
    assert flip.per_label[0].positive_agreement == 0.0
    # Zero counts are no posts.
    assert agreement({**TWO_BY_TWO, ("x", "x"): 0}).as_dict() == agreement(TWO_BY_TWO).as_dict()
