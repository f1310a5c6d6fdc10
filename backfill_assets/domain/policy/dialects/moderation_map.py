"""The ``openai-moderation`` dialect's answer, mapped onto the platform's policy (pure).

OpenAI's moderation endpoint answers category scores, not the policy's labels. The policy's
``dialects: openai-moderation: categories:`` section says which label (and rule) each category
leads to and from which score. A post takes the label of its highest-scoring category at or
above its threshold; equal scores go to the label of higher numeric severity, then to the label
listed first in the policy. Its rules are the rules of every category at or above threshold
that lead to that label (a label's answer names only its own rules: the output contract). No
category at or above threshold: the policy's ``none`` label, no rules.

``confidence`` is the deciding category's score; for the ``none`` label, one minus the highest
mapped score (how far the post stayed from every threshold's scale). Categories the section
does not name are ignored; a named category missing from the answer, or a score that is not a
number in [0, 1], refuses the answer (``OutputRejected``: a ``schema_rejected`` dead letter).
"""

from __future__ import annotations

import json
from typing import Any

from backfill_assets.domain.policy.dialect_sections import ModerationMap
from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.policy.output_gate import (
    ModerationOutput,
    OutputContract,
    OutputRejected,
)

# A result of the endpoint is a few kilobytes; anything far larger is not one.
_MAX_RESULT_BYTES = 64_000


def _scores(raw: str, wanted: tuple[str, ...]) -> dict[str, float]:
    """The named categories' scores from one stored result; ``OutputRejected`` otherwise."""
    if len(raw) > _MAX_RESULT_BYTES:
        raise OutputRejected(f"moderation result: longer than {_MAX_RESULT_BYTES} characters")
    try:
        data: Any = json.loads(raw)
    except (ValueError, RecursionError):
        raise OutputRejected("moderation result: not JSON") from None
    scores = data.get("category_scores") if isinstance(data, dict) else None
    if not isinstance(scores, dict):
        raise OutputRejected("moderation result: no category_scores object")
    out: dict[str, float] = {}
    for name in wanted:
        value = scores.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise OutputRejected(f"moderation result: no score for category {name!r}")
        score = float(value)
        if not 0.0 <= score <= 1.0:  # NaN fails this too
            raise OutputRejected(f"moderation result: score of {name!r} is not in [0, 1]")
        out[name] = score
    return out


def _severity_rank(policy: Policy) -> dict[str, tuple[float, int]]:
    """Label -> sort key: higher numeric severity first, then the policy's order."""
    rank: dict[str, tuple[float, int]] = {}
    for i, label in enumerate(policy.doc.labels):
        sev = label.severity
        numeric = float(sev) if isinstance(sev, int) and not isinstance(sev, bool) else None
        rank[label.id] = (-numeric if numeric is not None else float("inf"), i)
    return rank


def moderation_output(
    raw: str, sent_key: str, policy: Policy, mapping: ModerationMap, contract: OutputContract
) -> tuple[ModerationOutput, float | None]:
    """The label, rules and confidence of one stored moderation result under ``mapping``, and
    the label's probability: the deciding category's score (None for the ``none`` label, which
    no category decides)."""
    wanted = tuple(mapping.categories)
    scores = _scores(raw, wanted)
    over = [name for name in wanted if scores[name] >= mapping.categories[name].threshold]
    rule_ids: tuple[str, ...] = ()
    p_label: float | None = None
    if not over:
        top = max(scores.values(), default=0.0)
        label, confidence = policy.none_label, 1.0 - top
    else:
        rank = _severity_rank(policy)

        def order(name: str) -> tuple[float, tuple[float, int]]:
            return (-scores[name], rank[mapping.categories[name].label])

        decider = min(over, key=order)
        label = mapping.categories[decider].label
        named = {mapping.categories[n].rule for n in over if mapping.categories[n].label == label}
        rule_ids = tuple(r for r, _l in policy.rule_labels if r in named)
        confidence = p_label = scores[decider]
    why = contract.problem(label, rule_ids)
    if why is not None:  # the policy check refuses such a mapping; kept as a last guard
        raise OutputRejected(f"output contract: {why}")
    out = ModerationOutput(
        schema_version=1,
        correlation_id=sent_key,
        label=label,
        rule_ids=rule_ids,
        confidence=confidence,
    )
    return out, p_label
