"""Deterministic rules standing in for a model's judgement, under any policy (pure).

Shared by the in-process fake model and the provider simulator so both label the same post
the same way. ``judge`` works for any label set: a rule id of the policy found in the text
decides (that rule's label, with every rule of it found); else the keyword rules below, when
the label they pick is one of the policy's; else a label id found in the text; else the label
that means nothing applies.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass

from backfill_assets.domain.policy.output_gate import OutputContract

# Matched against the lower-cased text: cheaper than IGNORECASE on every search.
_SPAM = re.compile(
    r"\b(buy now|free money|click here|limited offer|crypto giveaway|discount code|"
    r"work from home|earn \$?\d+|viagra|casino)\b|https?://\S+\.(ru|xyz|top)\b"
)
_ABUSE = re.compile(r"\b(idiot|moron|stupid|loser|i will hurt you|kill you|trash human|shut up)\b")
_REVIEW = re.compile(
    r"\b(ignore (all )?previous instructions|system prompt|self[- ]harm|suicide|"
    r"label this post|you are now)\b"
)


def _keyword(lowered: str) -> str:
    """The built-in label set's keyword label of a lower-cased text."""
    if _REVIEW.search(lowered):
        return "needs_review"
    if _ABUSE.search(lowered):
        return "abuse"
    if _SPAM.search(lowered):
        return "spam"
    return "ok"


def _confidence(text: str) -> float:
    jitter = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:2], "big") / 65535
    return round(0.55 + 0.44 * jitter, 4)


def _tokens(ids: tuple[str, ...]) -> re.Pattern[str] | None:
    """Any of ``ids`` (lower-cased) as a whole token of a lower-cased text (ids may hold
    '.', '-' and '_', so word boundaries will not do)."""
    if not ids:
        return None
    alternatives = "|".join(re.escape(i.lower()) for i in sorted(ids, key=len, reverse=True))
    return re.compile(rf"(?<![a-z0-9._-])({alternatives})(?![a-z0-9_-])")


@dataclass(frozen=True, slots=True)
class _Matchers:
    """What ``judge`` needs of a contract, built once per contract."""

    rules: re.Pattern[str] | None
    labels: re.Pattern[str] | None
    # lower-cased id -> the policy's spelling
    rule_ids: dict[str, str]
    label_ids: dict[str, str]
    first_rule: dict[str, tuple[str, ...]]


@functools.lru_cache(maxsize=64)
def _matchers(contract: OutputContract) -> _Matchers:
    rules = tuple(r for r, _lb in contract.rules)
    others = tuple(lb for lb in contract.labels if lb != contract.none_label)
    return _Matchers(
        rules=_tokens(rules),
        labels=_tokens(others),
        rule_ids={r.lower(): r for r in rules},
        label_ids={lb.lower(): lb for lb in others},
        first_rule={lb: contract.rules_of(lb)[:1] for lb in contract.labels},
    )


def judge(text: str, contract: OutputContract) -> tuple[str, tuple[str, ...], float]:
    """(label, rule ids, confidence) under ``contract``; same text and policy, same answer,
    and always an answer the contract accepts."""
    confidence = _confidence(text)
    lowered = text.lower()
    j = _matchers(contract)
    if j.rules is not None:
        seen = {j.rule_ids[m] for m in j.rules.findall(lowered)}
        if seen:
            ordered = [r for r, _lb in contract.rules if r in seen]  # the policy's order
            label = contract.rule_label(ordered[0])
            assert label is not None
            return label, tuple(r for r in ordered if contract.rule_label(r) == label), confidence
    keyword = _keyword(lowered)
    if keyword != contract.none_label and keyword in j.first_rule:
        return keyword, j.first_rule[keyword], confidence
    if j.labels is not None:
        found = {j.label_ids[m] for m in j.labels.findall(lowered)}
        for label in contract.labels:
            if label in found:
                return label, j.first_rule[label], confidence
    return contract.none_label, (), confidence


def count_tokens(text: str) -> int:
    """Deterministic token count (about four characters a token)."""
    return max(1, (len(text) + 3) // 4)
