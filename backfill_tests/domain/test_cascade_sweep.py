"""The cascade optimiser's sweep (pure): routing and costs against a table worked out by hand
(dead letters that pass a post on and ones that stop it, an unknown score, a score equal to the
threshold), every post routed at once as one post is, the frontier and the choice with their
ties, the bootstrap's determinism, the grid's bounds, and the chosen file written back to the
same rules (docs/cascade.md, "Choosing thresholds: the optimiser")."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import numpy as np
import pytest

from backfill_assets.domain.cascade import (
    Cascade,
    CascadeStage,
    Decide,
    cascade_yaml,
    parse_cascade,
)
from backfill_assets.domain.cascade.measure import (
    OFF,
    GoldArrays,
    GoldPost,
    StageAnswer,
    macro_f1_interval,
)
from backfill_assets.domain.cascade.sweep import (
    GRID,
    MAX_SETTINGS,
    SettingFigures,
    best_lower_bound,
    choose,
    describe,
    frontier,
    route,
    settings_grid,
    sweep,
    with_setting,
)
from backfill_assets.domain.policy.evaluation import figures

LABELS = ["spam", "abuse", "ok"]
NONE = "ok"
JUDGE_NANOS = 100


def _a(label: str | None, score: float | None, nanos: int = 0, passes: bool = False) -> StageAnswer:
    return StageAnswer(label, score, nanos, passes)


def _judge(label: str | None) -> StageAnswer:
    return StageAnswer(label, None, JUDGE_NANOS)


# expected, the screen's answer (free), the judge's answer (100 nano-dollars each).
POSTS = [
    GoldPost("ok", (_a("ok", 0.99), _judge("ok"))),
    GoldPost("ok", (_a("ok", 0.95), _judge("spam"))),
    GoldPost("spam", (_a("spam", 0.92), _judge("spam"))),
    GoldPost("abuse", (_a("ok", 0.96), _judge("abuse"))),
    # schema_rejected at the screen: a final dead letter, the judge is asked.
    GoldPost("abuse", (_a(None, None, passes=True), _judge("abuse"))),
    # No score (a self-reported confidence only): never decides.
    GoldPost("spam", (_a("ok", None), _judge("spam"))),
    # retry_exhausted at the screen: no answer yet, the post goes no further.
    GoldPost("ok", (_a(None, None), _judge("ok"))),
    # Exactly at the threshold: decided. The judge was billed but its answer refused.
    GoldPost("spam", (_a("ok", 0.97), _judge(None))),
]
NONE_97: tuple[Decide | None, ...] = (Decide("none_label", 0.97),)
ANY_90: tuple[Decide | None, ...] = (Decide("any_label", 0.9),)
SCREEN_OFF: tuple[Decide | None, ...] = (OFF,)
# Per post: (stage whose answer is the label or where it stopped, label, nano-dollars).
ROUTES = {
    NONE_97: [
        (0, "ok", 0),
        (1, "spam", 100),
        (1, "spam", 100),
        (1, "abuse", 100),
        (1, "abuse", 100),
        (1, "spam", 100),
        (0, None, 0),
        (0, "ok", 0),
    ],
    ANY_90: [
        (0, "ok", 0),
        (0, "ok", 0),
        (0, "spam", 0),
        (0, "ok", 0),
        (1, "abuse", 100),
        (1, "spam", 100),
        (0, None, 0),
        (0, "ok", 0),
    ],
    SCREEN_OFF: [
        (1, "ok", 100),
        (1, "spam", 100),
        (1, "spam", 100),
        (1, "abuse", 100),
        (1, "abuse", 100),
        (1, "spam", 100),
        (1, "ok", 100),
        (1, None, 100),
    ],
}
# (decided by screen, by judge), unlabelled, cost, accuracy
TOTALS = {
    NONE_97: ((2, 5), 1, 500, 5 / 8),
    ANY_90: ((5, 2), 1, 200, 5 / 8),
    SCREEN_OFF: ((0, 7), 1, 800, 6 / 8),
}


@pytest.mark.parametrize("setting", list(ROUTES), ids=["none_97", "any_90", "off"])
def test_each_post_routes_as_the_table_says(setting: tuple[Decide | None, ...]) -> None:
    got = [route(setting, p.answers, NONE) for p in POSTS]
    assert [(r.stage, r.label, r.cost_nanos) for r in got] == ROUTES[setting]


@pytest.mark.parametrize("setting", list(ROUTES), ids=["none_97", "any_90", "off"])
def test_a_setting_measured_at_once_is_the_table(setting: tuple[Decide | None, ...]) -> None:
    got = GoldArrays(POSTS, LABELS, NONE).measure(setting)
    expected = [p.expected for p in POSTS]
    labels = [label for _s, label, _c in ROUTES[setting]]
    decided = Counter(s for s, label, _c in ROUTES[setting] if label is not None)
    assert got.decided == (decided[0], decided[1])
    assert got.unlabelled == labels.count(None) == 1
    assert got.cost_nanos == sum(c for _s, _l, c in ROUTES[setting])
    fig = figures(expected, labels, LABELS)
    assert (got.accuracy, got.macro_f1) == (fig.accuracy, fig.macro_f1)
    assert got.ci95[0] <= got.ci95[1]


def test_macro_f1_of_the_screen_off_worked_by_hand() -> None:
    got = GoldArrays(POSTS, LABELS, NONE).measure(SCREEN_OFF)
    # ok: 3 expected, 2 said, both right (P 1, R 2/3, F1 0.8); spam: 3 and 3, 2 right (2/3);
    # abuse: 2 and 2, both right (1). Post 8 has no label: wrong, in no label's column.
    assert got.macro_f1 == pytest.approx((0.8 + 2 / 3 + 1) / 3)
    assert got.accuracy == 6 / 8 and got.cost_nanos == 8 * JUDGE_NANOS


def test_the_figures_of_a_sweep_and_the_cost_in_whole_nano_dollars() -> None:
    swept = sweep(NONE_97, POSTS, LABELS, NONE)
    by = {f.setting: f for f in swept.settings}
    assert swept.own.setting == NONE_97
    for setting, (decided, unlabelled, cost, accuracy) in TOTALS.items():
        got = by[setting]
        assert (got.decided, got.unlabelled, got.cost_nanos, got.accuracy) == (
            decided,
            unlabelled,
            cost,
            accuracy,
        )
        assert isinstance(by[setting].cost_nanos, int)
    doc = by[NONE_97].as_dict(["screen", "judge"])
    # 500 nano-dollars over 8 posts: 62,500 per 1,000, exact.
    assert doc["cost_per_1000_posts_usd"] == "0.000062500" and doc["cost_nanos"] == 500
    assert doc["decided"] == {"screen": 2 / 8, "judge": 5 / 8} and doc["unlabelled"] == 1 / 8
    assert doc["rules"] == [{"stage": "screen", "when": "none_label", "min_score": 0.97}]
    off = by[SCREEN_OFF].as_dict(["screen", "judge"])
    assert off["rules"] == [{"stage": "screen", "when": None, "min_score": None}]
    assert off["setting"] == "screen off > judge"
    # 1 / 3 of a nano-dollar per post: rounded once, half to even.
    third = SettingFigures((OFF,), (0, 3), 0, 1, 3, 1.0, 1.0, (1.0, 1.0))
    assert third.cost_per_1000_nanos == 333


def _random_posts(seed: int, n: int, stages: int) -> list[GoldPost]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        expected = rng.choice(LABELS)
        answers = []
        for _k in range(stages):
            if rng.random() < 0.1:
                answers.append(StageAnswer(None, None, rng.randrange(50), rng.random() < 0.5))
                continue
            label = expected if rng.random() < 0.7 else rng.choice(LABELS)
            score = None if rng.random() < 0.1 else rng.choice([*GRID, rng.random()])
            answers.append(StageAnswer(label, score, rng.randrange(1000)))
        out.append(GoldPost(expected, tuple(answers)))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_every_post_at_once_routes_as_each_post_alone(seed: int) -> None:
    posts = _random_posts(seed, 60, 3)
    own = (Decide("none_label", 0.9), Decide("any_label", 0.8))
    arrays = GoldArrays(posts, LABELS, NONE)
    grid = settings_grid(own)
    for setting in random.Random(seed).sample(grid, 40):
        got = arrays.measure(setting)
        routes = [route(setting, p.answers, NONE) for p in posts]
        fig = figures([p.expected for p in posts], [r.label for r in routes], LABELS)
        assert got.cost_nanos == sum(r.cost_nanos for r in routes)
        assert got.decided == tuple(
            sum(1 for r in routes if r.label is not None and r.stage == k) for k in range(3)
        )
        assert (got.accuracy, got.macro_f1) == (fig.accuracy, fig.macro_f1)


def _f(setting: tuple[Decide | None, ...], cost: int, f1: float, lo: float) -> SettingFigures:
    return SettingFigures(setting, (0, 0), 0, cost, 10, f1, f1, (lo, min(1.0, f1 + 0.05)))


def test_the_frontier_and_the_choice_with_their_ties() -> None:
    at_90, at_95, at_99 = (Decide("none_label", v) for v in (0.9, 0.95, 0.99))
    any_95 = Decide("any_label", 0.95)
    settings = [
        _f((at_90,), 100, 0.70, 0.60),
        _f((any_95,), 100, 0.70, 0.60),  # the same point: none_label is the stricter
        _f((at_95,), 200, 0.80, 0.72),
        _f((at_99,), 200, 0.80, 0.72),  # the same point: 0.99 is the stricter
        _f((OFF,), 300, 0.80, 0.72),  # dominated: dearer, no better
        _f((Decide("any_label", 0.5),), 250, 0.75, 0.70),  # dominated
        _f((Decide("none_label", 0.999),), 400, 0.90, 0.85),
    ]
    front = frontier(settings)
    assert [(f.setting, f.cost_nanos) for f in front] == [
        ((at_90,), 100),
        ((at_99,), 200),
        ((Decide("none_label", 0.999),), 400),
    ]
    assert choose(settings, 0.72).setting == (at_99,)
    assert choose(settings, 0.6).setting == (at_90,)
    assert choose(settings, 0.86) is None
    assert best_lower_bound(settings).ci95[0] == 0.85
    # Same cost, one better: the better one, whatever the order.
    better = _f((at_95,), 200, 0.82, 0.72)
    assert choose([*settings, better], 0.72) is better
    assert choose(list(reversed([*settings, better])), 0.72) is better
    # off is the strictest of all at equal cost and macro-F1.
    free_off = _f((OFF,), 100, 0.70, 0.60)
    assert frontier([*settings, free_off])[0] is free_off


def _interval(cells: Counter[tuple[str, str | None]], labels: list[str], seed: int = 49) -> Any:
    """``macro_f1_interval`` of (expected, answered) counts (answered None: no label)."""
    width = len(labels) + 1
    counts = np.zeros(len(labels) * width, dtype=np.int64)
    for (e, a), n in cells.items():
        counts[labels.index(e) * width + (labels.index(a) if a else len(labels))] += n
    return macro_f1_interval(counts, len(labels), seed=seed)


def test_the_bootstrap_is_deterministic_and_narrows_with_more_rows() -> None:
    cells = Counter({("ok", "ok"): 8, ("ok", "spam"): 2, ("spam", "spam"): 6, ("spam", None): 1})
    labels = ["spam", "ok"]
    first = _interval(cells, labels)
    assert _interval(cells, labels) == first
    assert _interval(cells, labels, seed=7) != first
    point = figures(
        [e for (e, _a), n in cells.items() for _ in range(n)],
        [a for (_e, a), n in cells.items() for _ in range(n)],
        labels,
    ).macro_f1
    assert first[0] < point < first[1]
    wide = first[1] - first[0]
    tenfold = _interval(Counter({k: 10 * n for k, n in cells.items()}), labels)
    assert tenfold[1] - tenfold[0] < wide / 2
    assert _interval(Counter({("ok", "ok"): 5, ("spam", "spam"): 5}), labels) == (1, 1)
    assert _interval(Counter(), labels) == (0.0, 0.0)
    # A sweep run twice gives the same figures, intervals included.
    posts = _random_posts(1, 40, 2)
    a, b = (sweep(NONE_97, posts, LABELS, NONE) for _ in range(2))
    assert [f.ci95 for f in a.settings] == [f.ci95 for f in b.settings]


def test_the_grid_is_bounded_and_holds_the_file_s_own_rules() -> None:
    one = settings_grid(NONE_97)
    # off, and both `when` rules over the 52 values (0.97 among them).
    assert len(one) == 1 + 2 * len(GRID) and one[0] == NONE_97 and len(set(one)) == len(one)
    assert (OFF,) in one and (Decide("any_label", 0.999),) in one
    odd = settings_grid((Decide("any_label", 0.975),))
    assert len(odd) == 1 + 2 * (len(GRID) + 1) and (Decide("none_label", 0.975),) in odd
    two = settings_grid((Decide("none_label", 0.9), Decide("any_label", 0.8)))
    assert len(two) == (len(GRID) + 1) ** 2  # the whole grid: 53 x 53
    assert all(s[1] is OFF or s[1].when == "any_label" for s in two)
    for stages in range(3, 8):
        own = tuple(Decide("none_label", 0.905) for _ in range(stages))
        grid = settings_grid(own)
        assert len(grid) <= MAX_SETTINGS and grid[0] == own and len(set(grid)) == len(grid)
        assert tuple(OFF for _ in range(stages)) in grid
    assert settings_grid(()) == [()]


def test_the_chosen_setting_is_written_as_a_file_with_the_same_rules() -> None:
    cascade = Cascade(
        (
            CascadeStage("no", "openai-moderation", "omni-moderation-latest", NONE_97[0], 2),
            CascadeStage("first-pass", "llama-guard", "1.5", Decide("any_label", 0.9), 6),
            CascadeStage("judge", "chat-json", "gpt-4o-mini#x:{y}", None, 10),
        )
    )
    setting = (Decide("none_label", 0.995), Decide("none_label", 0.51))
    header = ["chosen on gold\nstages: []", "by a sweep"]  # a file name may hold a line end
    written = parse_cascade(cascade_yaml(with_setting(cascade, setting), header))
    assert written.routing_version() == with_setting(cascade, setting).routing_version()
    assert written.stage_version() == cascade.stage_version()
    assert [s.decide for s in written.stages] == [*setting, None]
    assert [(s.name, s.model) for s in written.stages] == [
        (s.name, s.model) for s in cascade.stages
    ]
    # An off stage is left out of the file.
    dropped = with_setting(cascade, (OFF, Decide("any_label", 0.99)))
    assert [s.name for s in dropped.stages] == ["first-pass", "judge"]
    back = parse_cascade(cascade_yaml(dropped))
    assert back.routing_version() == dropped.routing_version()
    assert describe((OFF, Decide("any_label", 0.99)), ["no", "first-pass", "judge"]) == (
        "no off > first-pass any_label>=0.99 > judge"
    )
