"""A chat answer's label probability from its tokens' log-probabilities (pure).

The server returns each generated token with its log-probability (OpenAI's
``choices[0].logprobs.content``). The probability of the label the answer chose is the product
of the probabilities of the tokens that spell its value (those that overlap the characters of
``"label": "<value>"``'s value): how sure the model was of that label, given the answer so far.
Nothing is invented: tokens that do not spell the answer exactly, a label found more than once,
or a log-probability that is not a finite number at most 0, give None.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

# (token text, log-probability), in the order generated.
TokenLogprobs = Sequence[tuple[str, float]]


def readable_logprob(value: object) -> float | None:
    """A log-probability as a server sent it, if it is one: a finite number at most 0 (not a
    boolean); None otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and value <= 0.0 else None


def label_probability(raw: str, label: str, logprobs: TokenLogprobs | None) -> float | None:
    """The probability of ``label``'s tokens in ``raw`` (None: not known)."""
    if not logprobs:
        return None
    if "".join(token for token, _lp in logprobs) != raw:
        return None  # the tokens are not this answer's: nothing can be aligned
    found = list(re.finditer(r'"label"\s*:\s*"' + re.escape(label) + '"', raw))
    if len(found) != 1:
        return None
    end = found[0].end() - 1  # the closing quote
    start = end - len(label)
    total, at = 0.0, 0
    for token, lp in logprobs:
        nxt = at + len(token)
        if nxt > start and at < end:
            readable = readable_logprob(lp)
            if readable is None:
                return None
            total += readable
        at = nxt
    return math.exp(total)
