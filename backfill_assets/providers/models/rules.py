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

from backfill_assets.core.rubric import OutputContract

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


def classify(text: str) -> tuple[str, float]:
    """Keyword label (of the built-in label set) and confidence; same text, same answer."""
    lowered = text.lower()
    if _REVIEW.search(lowered):
        label = "needs_review"
    elif _ABUSE.search(lowered):
        label = "abuse"
    elif _SPAM.search(lowered):
        label = "spam"
    else:
        label = "ok"
    return label, _confidence(text)


def _confidence(text: str) -> float:
    jitter = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:2], "big") / 65535
    return round(0.55 + 0.44 * jitter, 4)


@functools.lru_cache(maxsize=64)
def _id_pattern(ids: tuple[str, ...]) -> re.Pattern[str] | None:
    """Any of ``ids`` as a whole token (ids may hold '.', '-', '_'), case-insensitive."""
    if not ids:
        return None
    alternatives = "|".join(re.escape(i) for i in sorted(ids, key=len, reverse=True))
    return re.compile(rf"(?<![A-Za-z0-9._-])({alternatives})(?![A-Za-z0-9_-])", re.IGNORECASE)


def _found(ids: tuple[str, ...], text: str) -> list[str]:
    """The ids found in ``text``, in the order of ``ids``."""
    pattern = _id_pattern(ids)
    if pattern is None:
        return []
    seen = {m.lower() for m in pattern.findall(text)}
    return [i for i in ids if i.lower() in seen]


def judge(text: str, contract: OutputContract) -> tuple[str, tuple[str, ...], float]:
    """(label, rule ids, confidence) under ``contract``; same text and policy, same answer,
    and always an answer the contract accepts."""
    confidence = _confidence(text)
    rule_ids = tuple(r for r, _lb in contract.rules)
    for rule in _found(rule_ids, text):
        label = contract.rule_label(rule)
        assert label is not None
        same = tuple(r for r in _found(rule_ids, text) if contract.rule_label(r) == label)
        return label, same, confidence
    keyword, _ = classify(text)
    if keyword != contract.none_label and keyword in contract.labels:
        return keyword, contract.rules_of(keyword)[:1], confidence
    others = tuple(lb for lb in contract.labels if lb != contract.none_label)
    for label in _found(others, text):
        return label, contract.rules_of(label)[:1], confidence
    return contract.none_label, (), confidence


def count_tokens(text: str) -> int:
    """Deterministic token count (about four characters a token)."""
    return max(1, (len(text) + 3) // 4)
