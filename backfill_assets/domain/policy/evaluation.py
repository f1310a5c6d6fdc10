"""Gold-set evaluation figures (pure): per label precision, recall, F1 and 95% Wilson
intervals, accuracy, macro-F1, the confusion matrix, and between two policies their agreement,
Cohen's kappa and the transitions from one's labels to the other's.

A gold row the policy left without a label (its answer was ``schema_rejected``, or the call
failed) counts as wrong: it is the column ``NO_LABEL`` of the confusion matrix.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

NO_LABEL = "(no label)"
# The tenant that gold-set calls are booked to (``evaluate --tenant``); never a customer's.
DEFAULT_TENANT = "eval"
# The normal quantile of a two-sided 95% interval.
Z95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of ``successes`` out of ``n`` (None when ``n`` is 0)."""
    if n <= 0:
        return None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class Gate:
    """The evaluation gate (``BACKFILL_POLICY_MIN_MACRO_F1``, ``BACKFILL_POLICY_MIN_SUPPORT``):
    a policy version is swept only when its latest macro-F1 reaches ``min_macro_f1`` on a gold
    set holding at least ``min_support`` rows of every label of the policy."""

    min_macro_f1: float
    min_support: int

    def thin_labels(
        self, policy_labels: Sequence[str], support: Mapping[str, int]
    ) -> list[tuple[str, int]]:
        """(label, gold rows) of each policy label with fewer rows than ``min_support``."""
        return [
            (label, support.get(label, 0))
            for label in policy_labels
            if support.get(label, 0) < self.min_support
        ]


@dataclass(frozen=True)
class LabelFigures:
    """One label's figures; precision and recall are None when undefined (nothing to divide)."""

    label: str
    support: int
    predicted: int
    true_positives: int
    precision: float | None
    recall: float | None
    f1: float
    precision_ci: tuple[float, float] | None
    recall_ci: tuple[float, float] | None

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "label": self.label,
            "support": self.support,
            "predicted": self.predicted,
            "true_positives": self.true_positives,
            "precision": self.precision,
            "recall": self.recall,
            "f1": self.f1,
            "precision_ci95": list(self.precision_ci) if self.precision_ci else None,
            "recall_ci95": list(self.recall_ci) if self.recall_ci else None,
        }


@dataclass(frozen=True)
class Figures:
    """A policy's figures on a gold set."""

    rows: int
    labels: tuple[str, ...]
    per_label: tuple[LabelFigures, ...]
    accuracy: float
    macro_f1: float
    # expected label -> predicted label (or NO_LABEL) -> count
    confusion: Mapping[str, Mapping[str, int]]
    unlabelled: Mapping[str, int] = field(default_factory=dict)

    @property
    def schema_rejected_share(self) -> float:
        """Share of the gold rows whose answer was ``schema_rejected``."""
        return self.unlabelled.get("schema_rejected", 0) / self.rows if self.rows else 0.0


def figures(
    expected: Sequence[str],
    predicted: Sequence[str | None],
    policy_labels: Sequence[str],
    outcomes: Sequence[str] | None = None,
) -> Figures:
    """Figures of ``predicted`` against ``expected`` (None: no label; ``outcomes`` says why)."""
    if len(expected) != len(predicted):
        raise ValueError("expected and predicted differ in length")
    got = [p if p is not None else NO_LABEL for p in predicted]
    labels = tuple(dict.fromkeys([*policy_labels, *expected]))
    confusion = {e: dict.fromkeys([*labels, NO_LABEL], 0) for e in labels}
    for e, p in zip(expected, got, strict=True):
        confusion[e][p] += 1
    unlabelled: Counter[str] = Counter()
    if outcomes is not None:
        unlabelled.update(o for p, o in zip(predicted, outcomes, strict=True) if p is None)
    return confusion_figures(labels, confusion, dict(unlabelled))


def confusion_figures(
    labels: Sequence[str],
    confusion: Mapping[str, Mapping[str, int]],
    unlabelled: Mapping[str, int] | None = None,
) -> Figures:
    """``figures`` of the rows a confusion matrix counts (expected label -> answered label or
    ``NO_LABEL`` -> rows, a row for each of ``labels``, every column in each), without the rows
    themselves: a cascade's sweep measures thousands of settings this way."""
    rows = sum(sum(row.values()) for row in confusion.values())
    per_label = []
    present: list[float] = []
    for label in labels:
        tp = confusion[label][label]
        n_pred = sum(row[label] for row in confusion.values())
        n_true = sum(confusion[label].values())
        precision = tp / n_pred if n_pred else None
        recall = tp / n_true if n_true else None
        f1 = (
            2 * precision * recall / (precision + recall)
            if precision is not None and recall is not None and precision + recall > 0
            else 0.0
        )
        per_label.append(
            LabelFigures(
                label,
                n_true,
                n_pred,
                tp,
                precision,
                recall,
                f1,
                wilson(tp, n_pred),
                wilson(tp, n_true),
            )
        )
        if n_true or n_pred:
            present.append(f1)
    correct = sum(confusion[label][label] for label in labels)
    return Figures(
        rows=rows,
        labels=tuple(labels),
        per_label=tuple(per_label),
        accuracy=correct / rows if rows else 0.0,
        macro_f1=sum(present) / len(present) if present else 0.0,
        confusion=confusion,
        unlabelled=dict(unlabelled or {}),
    )


@dataclass(frozen=True)
class Comparison:
    """Two policies' labels of the same gold rows, side by side."""

    agreement: float
    kappa: float | None
    # label under A -> label under B -> count (NO_LABEL included): sums to the rows
    transitions: Mapping[str, Mapping[str, int]]


def compare(a: Sequence[str | None], b: Sequence[str | None]) -> Comparison:
    """Agreement, Cohen's kappa and transitions between two labellings of the same rows.

    A row either policy left without a label is the category ``NO_LABEL``; kappa is None when
    chance agreement is certain (both gave one and the same label to every row) and they
    disagree, which cannot happen, or when there are no rows.
    """
    if len(a) != len(b):
        raise ValueError("the labellings differ in length")
    xs = [x if x is not None else NO_LABEL for x in a]
    ys = [y if y is not None else NO_LABEL for y in b]
    n = len(xs)
    transitions: dict[str, dict[str, int]] = {}
    for x, y in zip(xs, ys, strict=True):
        row = transitions.setdefault(x, {})
        row[y] = row.get(y, 0) + 1
    if not n:
        return Comparison(0.0, None, transitions)
    observed = sum(1 for x, y in zip(xs, ys, strict=True) if x == y) / n
    ca, cb = Counter(xs), Counter(ys)
    chance = sum(ca[k] * cb.get(k, 0) for k in ca) / (n * n)
    kappa = 1.0 if chance == 1.0 else (observed - chance) / (1 - chance)
    return Comparison(observed, kappa, transitions)
