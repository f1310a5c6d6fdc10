"""Agreement between the model's labels and moderators' decisions, from the counts of their
pairs (pure; the ledger groups the pairs: ``ledger/decisions/agreement.py``).

Three figures, each with a two-sided 95% interval:

- **Observed agreement**: the share of posts where the model's label is the moderator's,
  with the Wilson score interval (``evaluation.wilson``, as the gold-set figures).
- **Cohen's kappa**: agreement beyond what the two labellings' own label shares give by
  chance, ``(p_o - p_e) / (1 - p_e)``. Its interval is ``kappa +- z * SE`` with the
  large-sample standard error of Fleiss, Cohen and Everitt (1969, Psychological Bulletin 72,
  "Large sample standard errors of kappa and weighted kappa"), clipped to [-1, 1]. It is an
  asymptotic interval: with few posts it is wide, and below ~30 it is only indicative.
- **Per label**: for each label, among the posts where either side used it, the *positive
  agreement* ``2a / (2a + b + c)`` (a: both used it; b, c: only the model, only the
  moderator), and the one-vs-rest kappa (the label against every other label, a 2x2 table)
  with the same interval. Positive agreement is not swamped by the posts neither side gave
  the label, which is most posts for a rare label.

When both sides gave one and the same label to every post, chance agreement is certain and
kappa is 1.0 as in ``evaluation.compare`` (no interval: its error is undefined).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backfill_assets.domain.policy.evaluation import Z95, wilson

# (model label, moderator's label) -> posts
Pairs = Mapping[tuple[str, str], int]
Interval = tuple[float, float]


@dataclass(frozen=True)
class Kappa:
    """Cohen's kappa, its large-sample standard error and 95% interval (None: no posts)."""

    value: float | None
    se: float | None
    ci: Interval | None


@dataclass(frozen=True)
class LabelAgreement:
    """One label's agreement among the posts either side gave it."""

    label: str
    model: int
    human: int
    both: int
    positive_agreement: float | None
    kappa: Kappa

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "label": self.label,
            "model": self.model,
            "human": self.human,
            "both": self.both,
            "positive_agreement": self.positive_agreement,
            "kappa": self.kappa.value,
            "kappa_ci95": list(self.kappa.ci) if self.kappa.ci else None,
        }


@dataclass(frozen=True)
class Agreement:
    """The model against the moderators over the posts both labelled."""

    posts: int
    agreed: int
    observed: float | None
    observed_ci: Interval | None
    kappa: Kappa
    per_label: tuple[LabelAgreement, ...]

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "posts": self.posts,
            "agreed": self.agreed,
            "agreement": self.observed,
            "agreement_ci95": list(self.observed_ci) if self.observed_ci else None,
            "kappa": self.kappa.value,
            "kappa_se": self.kappa.se,
            "kappa_ci95": list(self.kappa.ci) if self.kappa.ci else None,
            "labels": [x.as_dict() for x in self.per_label],
        }


def cohen_kappa(pairs: Pairs, z: float = Z95) -> Kappa:
    """Cohen's kappa of a confusion table (rater A's label, rater B's label) -> count, with
    the Fleiss-Cohen-Everitt (1969) large-sample standard error:

    ``var = (A + B - C) / (n (1 - p_e)^2)``, where, with cell shares ``p_ij``, A's marginals
    ``p_i.`` and B's ``p_.j``:
    ``A = sum_i p_ii (1 - (p_i. + p_.i)(1 - k))^2``,
    ``B = (1 - k)^2 sum_{i != j} p_ij (p_.i + p_j.)^2``,
    ``C = (k - p_e (1 - k))^2``.
    """
    n = sum(pairs.values())
    if n <= 0:
        return Kappa(None, None, None)
    rows: dict[str, float] = {}
    cols: dict[str, float] = {}
    for (a, b), count in pairs.items():
        rows[a] = rows.get(a, 0.0) + count / n
        cols[b] = cols.get(b, 0.0) + count / n
    observed = sum(count for (a, b), count in pairs.items() if a == b) / n
    chance = sum(share * cols.get(label, 0.0) for label, share in rows.items())
    if chance >= 1.0:
        return Kappa(1.0, None, None)
    k = (observed - chance) / (1 - chance)
    diag = 0.0
    off = 0.0
    for (a, b), count in pairs.items():
        p = count / n
        if a == b:
            diag += p * (1 - (rows.get(a, 0.0) + cols.get(a, 0.0)) * (1 - k)) ** 2
        else:
            off += p * (cols.get(a, 0.0) + rows.get(b, 0.0)) ** 2
    spread = diag + (1 - k) ** 2 * off - (k - chance * (1 - k)) ** 2
    se = math.sqrt(max(spread, 0.0) / (n * (1 - chance) ** 2))
    return Kappa(k, se, (max(-1.0, k - z * se), min(1.0, k + z * se)))


def _label_agreement(label: str, pairs: Pairs) -> LabelAgreement:
    both = sum(c for (m, h), c in pairs.items() if m == label and h == label)
    model = sum(c for (m, _h), c in pairs.items() if m == label)
    human = sum(c for (_m, h), c in pairs.items() if h == label)
    either = model + human  # 2a + b + c
    vs_rest: dict[tuple[str, str], int] = {}
    for (m, h), c in pairs.items():
        key = (str(m == label), str(h == label))
        vs_rest[key] = vs_rest.get(key, 0) + c
    return LabelAgreement(
        label,
        model,
        human,
        both,
        2 * both / either if either else None,
        cohen_kappa(vs_rest),
    )


def agreement(pairs: Pairs) -> Agreement:
    """Observed agreement, Cohen's kappa and each label's agreement of the (model label,
    moderator's label) -> posts counts; per label in label order."""
    kept = {k: int(c) for k, c in pairs.items() if c > 0}
    n = sum(kept.values())
    agreed = sum(c for (m, h), c in kept.items() if m == h)
    labels = sorted({x for pair in kept for x in pair})
    return Agreement(
        posts=n,
        agreed=agreed,
        observed=agreed / n if n else None,
        observed_ci=wilson(agreed, n),
        kappa=cohen_kappa(kept),
        per_label=tuple(_label_agreement(label, kept) for label in labels),
    )
