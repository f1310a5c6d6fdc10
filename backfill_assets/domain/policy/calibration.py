"""Calibration of a policy's scores on a gold set (pure): reliability tables over 10 equal-width
bins, the expected calibration error (ECE), and precision and recall at each threshold of a
fixed grid, overall and per label (one label against the rest).

A row's score is the probability the backfill stored for the label it chose (``label_score``).
A gold row the policy left without a label (``schema_rejected``, a failed call) has no score:
it is in no bin and predicted at no threshold, but it still counts among the positives.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

N_BINS = 10
# The PR table's thresholds: 0.00, 0.01, ..., 1.00. A fixed grid, not each distinct score, so
# every label and every evaluation has the same 101 rows whatever the gold set's size.
THRESHOLDS: tuple[float, ...] = tuple(i / 100 for i in range(101))
P_LABEL = "p_label"
CONFIDENCE = "confidence"


def label_score(p_label: float | None, confidence: float) -> tuple[float, str]:
    """The score of a stored answer and its source: ``p_label`` (the probability of the chosen
    label) when the row has one, else the model's self-reported ``confidence``."""
    if p_label is not None:
        return float(p_label), P_LABEL
    return float(confidence), CONFIDENCE


def bin_of(score: float, bins: int = N_BINS) -> int:
    """The bin of a score in [0, 1]: [i/bins, (i+1)/bins), the last one closed (1.0 is in it)."""
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"score {score!r} is outside [0, 1]")
    # Compared with the edges themselves, not int(score * bins): 0.3 must fall in [0.3, 0.4).
    edges = [i / bins for i in range(1, bins)]
    return bisect.bisect_right(edges, score)


@dataclass(frozen=True)
class Bin:
    """One reliability bin; mean score and accuracy are None when the bin is empty."""

    lower: float
    upper: float
    count: int
    mean_score: float | None
    accuracy: float | None

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "lower": self.lower,
            "upper": self.upper,
            "count": self.count,
            "mean_score": self.mean_score,
            "accuracy": self.accuracy,
        }


@dataclass(frozen=True)
class Reliability:
    """Scores against how often they were right; ``ece`` is None when there are no scores."""

    bins: tuple[Bin, ...]
    ece: float | None

    @property
    def rows(self) -> int:
        """The scored rows."""
        return sum(b.count for b in self.bins)


def reliability(
    scores: Sequence[float], correct: Sequence[bool], bins: int = N_BINS
) -> Reliability:
    """The reliability table of ``scores`` and ``correct``, and its ECE: the sum over bins of
    (rows in the bin / rows) * |accuracy in the bin - mean score in the bin|."""
    if len(scores) != len(correct):
        raise ValueError("scores and correct differ in length")
    counts = [0] * bins
    score_sums = [0.0] * bins
    hits = [0] * bins
    for score, ok in zip(scores, correct, strict=True):
        i = bin_of(score, bins)
        counts[i] += 1
        score_sums[i] += score
        hits[i] += int(ok)
    table = tuple(
        Bin(
            i / bins,
            (i + 1) / bins,
            counts[i],
            score_sums[i] / counts[i] if counts[i] else None,
            hits[i] / counts[i] if counts[i] else None,
        )
        for i in range(bins)
    )
    n = len(scores)
    if not n:
        return Reliability(table, None)
    ece = sum(
        b.count / n * abs(b.accuracy - b.mean_score)
        for b in table
        if b.accuracy is not None and b.mean_score is not None
    )
    return Reliability(table, ece)


@dataclass(frozen=True)
class PrCurve:
    """Precision and recall at each threshold (a row per threshold, columns side by side).

    At threshold t a row is predicted when it has a score >= t; precision is None when nothing
    is predicted, recall None when there are no positives."""

    thresholds: tuple[float, ...]
    positives: int
    predicted: tuple[int, ...]
    true_positives: tuple[int, ...]
    precision: tuple[float | None, ...]
    recall: tuple[float | None, ...]

    def as_dict(self) -> dict[str, Any]:
        """JSON form (the thresholds are the calibration's, given once)."""
        return {
            "positives": self.positives,
            "predicted": list(self.predicted),
            "true_positives": list(self.true_positives),
            "precision": list(self.precision),
            "recall": list(self.recall),
        }


def pr_curve(
    scores: Sequence[float | None],
    hits: Sequence[bool],
    positives: int,
    thresholds: Sequence[float] = THRESHOLDS,
) -> PrCurve:
    """Precision and recall at each threshold: ``scores[i]`` is None when row i is predicted at
    no threshold, ``hits[i]`` says whether predicting it is right, ``positives`` is how many
    rows are right to predict (the recall's denominator)."""
    if len(scores) != len(hits):
        raise ValueError("scores and hits differ in length")
    scored = sorted((s, h) for s, h in zip(scores, hits, strict=True) if s is not None)
    ordered = [s for s, _ in scored]
    # hits_from[i]: the hits among scored[i:], so each threshold is a bisection, not a pass.
    hits_from = [0] * (len(scored) + 1)
    for i in range(len(scored) - 1, -1, -1):
        hits_from[i] = hits_from[i + 1] + int(scored[i][1])
    predicted: list[int] = []
    true_positives: list[int] = []
    for t in thresholds:
        first = bisect.bisect_left(ordered, t)
        predicted.append(len(scored) - first)
        true_positives.append(hits_from[first])
    return PrCurve(
        thresholds=tuple(thresholds),
        positives=positives,
        predicted=tuple(predicted),
        true_positives=tuple(true_positives),
        precision=tuple(
            tp / n if n else None for tp, n in zip(true_positives, predicted, strict=True)
        ),
        recall=tuple(tp / positives if positives else None for tp in true_positives),
    )


@dataclass(frozen=True)
class LabelCalibration:
    """One label against the rest: the rows the policy gave it, and its PR curve."""

    label: str
    reliability: Reliability
    pr: PrCurve

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"label": self.label, **_reliability_dict(self.reliability), "pr": self.pr.as_dict()}


@dataclass(frozen=True)
class Calibration:
    """A policy's calibration on a gold set. ``score`` names where the scores came from
    (``p_label``, ``confidence``, or ``mixed``: some rows had one, some the other)."""

    score: str
    rows: int
    overall: Reliability
    overall_pr: PrCurve
    per_label: tuple[LabelCalibration, ...]

    def as_dict(self) -> dict[str, Any]:
        """JSON form (docs/policies.md, "Calibration")."""
        return {
            "score": self.score,
            "rows": self.rows,
            "scored_rows": self.overall.rows,
            "bins": len(self.overall.bins),
            "thresholds": list(self.overall_pr.thresholds),
            "overall": {**_reliability_dict(self.overall), "pr": self.overall_pr.as_dict()},
            "labels": [c.as_dict() for c in self.per_label],
        }


def _reliability_dict(r: Reliability) -> dict[str, Any]:
    return {"rows": r.rows, "ece": r.ece, "reliability": [b.as_dict() for b in r.bins]}


def _source(sources: Sequence[str | None]) -> str:
    used = {s for s in sources if s is not None}
    if len(used) > 1:
        return "mixed"
    return used.pop() if used else CONFIDENCE


def calibration(
    expected: Sequence[str],
    predicted: Sequence[str | None],
    scores: Sequence[float | None],
    labels: Sequence[str],
    sources: Sequence[str | None] | None = None,
) -> Calibration:
    """Calibration of ``predicted`` (None: no label, then its score is None too) with their
    ``scores`` against ``expected``, per label of ``labels`` and overall; ``sources`` names
    each score's source (``label_score``'s second value).

    Overall, a row is right when its label is the gold one; its PR curve is the micro-average
    (precision: right among the rows scored >= t; recall: right among all gold rows). Per
    label L, the rows labelled L are binned with their score and are right when gold is L;
    the positives of L's PR curve are the gold rows of L.
    """
    if not len(expected) == len(predicted) == len(scores):
        raise ValueError("expected, predicted and scores differ in length")
    if any((p is None) != (s is None) for p, s in zip(predicted, scores, strict=True)):
        raise ValueError("a row has a label without a score, or a score without a label")
    right = [p == e for e, p in zip(expected, predicted, strict=True)]
    kept = [(s, ok) for s, ok in zip(scores, right, strict=True) if s is not None]
    overall = reliability([s for s, _ in kept], [ok for _, ok in kept])
    overall_pr = pr_curve(scores, right, len(expected))
    per_label = []
    for label in dict.fromkeys([*labels, *expected]):
        mine = [s if p == label else None for p, s in zip(predicted, scores, strict=True)]
        gold = [e == label for e in expected]
        given = [(s, g) for s, g in zip(mine, gold, strict=True) if s is not None]
        per_label.append(
            LabelCalibration(
                label,
                reliability([s for s, _ in given], [g for _, g in given]),
                pr_curve(mine, gold, sum(gold)),
            )
        )
    return Calibration(
        score=_source(sources or []),
        rows=len(expected),
        overall=overall,
        overall_pr=overall_pr,
        per_label=tuple(per_label),
    )
