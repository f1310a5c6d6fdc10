"""Which posts a cascade's stage decides, and which it passes on to the next stage (pure).

A stage's score for a post is the probability the wire gave (``p_label``). For the moderation
endpoint, whose ``none`` label has no ``p_label``, the score is its stored ``confidence``, which
for that dialect is computed from the wire's scores (1 - the highest category score), never
self-reported. Otherwise (no ``p_label``: the model only self-reported a confidence) the score
is unknown, and an unknown score never decides: the post escalates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from backfill_assets.domain.policy.dialect_sections import OPENAI_MODERATION

# Decide "nothing applies" when confident; decide whatever the label, when confident.
NONE_LABEL = "none_label"
ANY_LABEL = "any_label"
WHENS = (NONE_LABEL, ANY_LABEL)


@dataclass(frozen=True, slots=True)
class Decide:
    """A stage's decide rule: the posts it keeps (``when``, from ``min_score``); the rest go on."""

    when: str  # "none_label" | "any_label"
    min_score: float


def stage_score(dialect: str, p_label: float | None, confidence: float) -> float | None:
    """A stage's score for a post: ``p_label`` (the wire's probability of the label); in the
    moderation dialect, whose ``none`` label has none, the stored ``confidence`` (computed there
    from the wire's scores, 1 - the highest category score); otherwise None, unknown (a model's
    self-reported confidence is never a score)."""
    if p_label is not None:
        return p_label
    if dialect == OPENAI_MODERATION:
        return confidence
    return None


def decides(rule: Decide | None, label: str, score: float | None, none_label: str) -> bool:
    """Whether the stage with ``rule`` decides a post it labelled ``label`` with ``score``.

    No rule (the last stage): True, it decides everything that reaches it. ``none_label``: iff
    the label is the policy's ``none_label`` and ``score >= min_score``. ``any_label``: iff
    ``score >= min_score``, whatever the label. An unknown score (None, or not a number) never
    decides: the post escalates.
    """
    if rule is None:
        return True
    if score is None or not math.isfinite(score):
        return False
    if rule.when == NONE_LABEL:
        return label == none_label and score >= rule.min_score
    if rule.when == ANY_LABEL:
        return score >= rule.min_score
    raise ValueError(f"decide when {rule.when!r}: expected one of {', '.join(WHENS)}")
