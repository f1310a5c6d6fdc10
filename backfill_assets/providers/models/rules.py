"""Deterministic keyword rules standing in for a model's judgement (pure).

Shared by the in-process fake model and the provider simulator so both label the same post
the same way.
"""

from __future__ import annotations

import hashlib
import re

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
    """Label and confidence for a post text; same text, same answer."""
    lowered = text.lower()
    if _REVIEW.search(lowered):
        label = "needs_review"
    elif _ABUSE.search(lowered):
        label = "abuse"
    elif _SPAM.search(lowered):
        label = "spam"
    else:
        label = "ok"
    jitter = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:2], "big") / 65535
    return label, round(0.55 + 0.44 * jitter, 4)


def count_tokens(text: str) -> int:
    """Deterministic token count (about four characters a token)."""
    return max(1, (len(text) + 3) // 4)
