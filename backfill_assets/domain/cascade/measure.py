"""Many settings of a cascade's decide rules measured on one gold set (pure, numpy): the gold
posts held as arrays, each setting routed over them by masks, and each labelling's macro-F1
with its bootstrap interval. ``sweep.py`` says what a setting is and which are swept; its
``route`` is the one post's way, and this routes every post the same way at once
(``backfill_tests/domain/test_cascade_sweep.py`` holds the two equal).

Which posts a stage decides under a rule is asked of ``decides`` once per post, stage and rule
(a grid of thousands of settings asks each question once). numpy is loaded on first use: it
comes with pandas, and only the sweep needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from backfill_assets.domain.cascade.decide import Decide, decides
from backfill_assets.domain.policy.evaluation import NO_LABEL, confusion_figures

RESAMPLES = 1_000
SEED = 49
# A stage that is off: left out, deciding nothing and paid nothing.
OFF = None

Setting = tuple[Decide | None, ...]  # one rule per stage but the last; None: off


@dataclass(frozen=True, slots=True)
class StageAnswer:
    """A stage's stored answer for one gold post. ``label`` None: it has none (``passes``: a
    final dead letter, the post goes on to the next stage; else it stops there)."""

    label: str | None
    score: float | None
    cost_nanos: int
    passes: bool = False


@dataclass(frozen=True, slots=True)
class GoldPost:
    """A gold row: its expected label and every stage's answer, in the stages' order."""

    expected: str
    answers: tuple[StageAnswer, ...]


@dataclass(frozen=True, slots=True)
class Measured:
    """What one setting does on the gold set."""

    decided: tuple[int, ...]  # posts labelled by each stage, in the stages' order
    unlabelled: int  # posts left without a label (a dead letter on their way)
    cost_nanos: int  # every call the setting makes, over the gold posts
    accuracy: float
    macro_f1: float
    ci95: tuple[float, float]


def _np() -> Any:
    import numpy

    return numpy


class GoldArrays:
    """The gold posts as arrays: per stage its answers' labels, costs and what a missing one
    means; each (expected, answered) pair as one cell index, ``NO_LABEL`` the last column."""

    def __init__(self, posts: Sequence[GoldPost], policy_labels: Sequence[str], none: str):
        np = _np()
        self.posts, self.none_label = posts, none
        # The labels ``figures`` measures, in its order.
        self.labels = tuple(dict.fromkeys([*policy_labels, *(p.expected for p in posts)]))
        self.policy_labels = tuple(policy_labels)
        self.width = len(self.labels) + 1
        index = {label: i for i, label in enumerate(self.labels)}
        self.stages = len(posts[0].answers) if posts else 0
        expected = np.array([index[p.expected] for p in posts], dtype=np.int64)
        self.unlabelled_cell = expected * self.width + len(self.labels)
        column = [[p.answers[k] for p in posts] for k in range(self.stages)]
        self.answered = [np.array([a.label is not None for a in c], dtype=bool) for c in column]
        self.passes = [np.array([a.passes for a in c], dtype=bool) for c in column]
        self.cost = [np.array([a.cost_nanos for a in c], dtype=np.int64) for c in column]
        self.cell = [
            expected * self.width
            + np.array([index[a.label] if a.label is not None else 0 for a in c], dtype=np.int64)
            for c in column
        ]
        self._decided: dict[tuple[int, Decide], Any] = {}
        self._figures: dict[bytes, tuple[float, float, tuple[float, float]]] = {}

    def _decides(self, k: int, rule: Decide) -> Any:
        """Which posts stage ``k``'s answer decides under ``rule`` (asked once)."""
        if (k, rule) not in self._decided:
            self._decided[(k, rule)] = _np().array(
                [
                    a.label is not None and decides(rule, a.label, a.score, self.none_label)
                    for a in (p.answers[k] for p in self.posts)
                ],
                dtype=bool,
            )
        return self._decided[(k, rule)]

    def measure(self, setting: Setting) -> Measured:
        """Route every post under ``setting`` as ``sweep.route`` does, and measure it."""
        np = _np()
        n, last = len(self.posts), self.stages - 1
        reach = np.ones(n, dtype=bool)
        cells = np.zeros(len(self.labels) * self.width, dtype=np.int64)
        cost, decided = 0, []
        for k in range(self.stages):
            rule = setting[k] if k < last else None
            if k < last and rule is OFF:
                decided.append(0)
                continue
            cost += int(self.cost[k][reach].sum())
            mine = self.answered[k] if rule is None else self._decides(k, rule)
            done = reach & mine
            decided.append(int(done.sum()))
            cells += np.bincount(self.cell[k][done], minlength=cells.size)
            left = reach & ~done
            on = left & (self.answered[k] | self.passes[k]) if k < last else left & False
            cells += np.bincount(self.unlabelled_cell[left & ~on], minlength=cells.size)
            reach = on
        accuracy, macro_f1, ci95 = self._scores(cells)
        return Measured(tuple(decided), n - sum(decided), cost, accuracy, macro_f1, ci95)

    def _scores(self, cells: Any) -> tuple[float, float, tuple[float, float]]:
        """Accuracy and macro-F1 as ``figures`` computes them, and the interval, once per
        distinct confusion matrix."""
        key = cells.tobytes()
        if key not in self._figures:
            columns = [*self.labels, NO_LABEL]
            counts = cells.reshape(len(self.labels), self.width).tolist()
            confusion = {
                e: dict(zip(columns, row, strict=True))
                for e, row in zip(self.labels, counts, strict=True)
            }
            fig = confusion_figures(self.labels, confusion)
            self._figures[key] = (
                fig.accuracy,
                fig.macro_f1,
                macro_f1_interval(cells, len(self.labels)),
            )
        return self._figures[key]


def macro_f1_interval(
    counts: Any, labels: int, resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of macro-F1 over the rows a confusion matrix
    counts, given as flat counts: ``labels`` rows (expected) of ``labels + 1`` columns
    (answered; the last: no label)."""
    np = _np()
    n = int(counts.sum())
    if n == 0:
        return (0.0, 0.0)
    cells = np.flatnonzero(counts)
    draws = np.random.Generator(np.random.PCG64(seed)).multinomial(
        n, counts[cells] / n, size=resamples
    )
    expected, answered = np.divmod(cells, labels + 1)
    support = np.zeros((cells.size, labels))
    support[np.arange(cells.size), expected] = 1
    said = np.zeros((cells.size, labels))
    given = answered < labels
    said[np.arange(cells.size)[given], answered[given]] = 1
    true_pos = support * said
    tp, both = draws @ true_pos, draws @ support + draws @ said
    present = both > 0
    f1 = np.where(present, 2 * tp / np.where(present, both, 1), 0.0)
    macro = f1.sum(axis=1) / np.maximum(present.sum(axis=1), 1)
    lo, hi = np.quantile(macro, [0.025, 0.975])
    return (float(lo), float(hi))
