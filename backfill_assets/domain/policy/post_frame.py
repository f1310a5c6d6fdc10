"""The post inside the prompt: ``<post>`` ... ``</post>``, and the encoding that keeps a post's
text from ever closing or reopening that frame (pure).

The encoding is total and reversible. ``&``, ``<`` and ``>`` are always written as ``&amp;``,
``&lt;`` and ``&gt;``, so no post holds a raw bracket and an escaped ``</post>`` never looks
like a literal ``&lt;/post>``. Characters a model could read as a bracket are written as
numeric references (``&#xFF1C;``): every character whose compatibility decomposition holds a
``<``, ``>`` or ``&`` (fullwidth and small forms, ``≮``), and the brackets Unicode lists as
confusable with ``<`` and ``>`` or that are angle brackets in their own right. A test walks the
whole Unicode database to keep the first group complete. ``decode_post`` gives the text back.

Keys name the post's text, not its framing, so work labelled under the earlier escaping is not
sent again.
"""

from __future__ import annotations

import re

POST_OPEN = "<post>\n"
POST_CLOSE = "\n</post>"

_NAMED = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# Compatibility forms of the three (NFKD holds one of them): U+226E/F decompose to "<"/">" plus
# a combining stroke.
_COMPATIBLE = "\u226e\u226f\ufe60\ufe64\ufe65\uff06\uff1c\uff1e"
# Look-alikes of "<" and ">" (Unicode's confusables) and angle brackets of other scripts.
_LOOKALIKE = (
    "\u02c2\u02c3\u1433\u1438\u16b2\u2039\u203a\u2329\u232a\u276c\u276d\u276e\u276f"
    "\u27e8\u27e9\u2991\u2992\u29fc\u29fd\u3008\u3009\u300a\u300b"
    "\U0001d236\U0001d237\U00016f3f"
)
_ENCODE = {ord(c): e for c, e in _NAMED.items()} | {
    ord(c): f"&#x{ord(c):X};" for c in _COMPATIBLE + _LOOKALIKE
}
_NEEDS = re.compile("[" + re.escape("".join(map(chr, _ENCODE))) + "]")
_DECODE = re.compile(r"&(?:(amp|lt|gt)|#x([0-9A-F]{1,6}));")
_NAMED_BACK = {"amp": "&", "lt": "<", "gt": ">"}


def encode_post(text: str) -> str:
    """``text`` as the frame holds it: no character of it can open or close an element."""
    # Most posts hold none of these: one scan in C, no copy.
    return text.translate(_ENCODE) if _NEEDS.search(text) else text


def decode_post(encoded: str) -> str:
    """The text ``encode_post`` was given."""
    return _DECODE.sub(lambda m: _NAMED_BACK[m[1]] if m[1] else chr(int(m[2], 16)), encoded)


def framed(key: str, text: str) -> str:
    """The user message: the correlation id, then the encoded post inside its frame."""
    return f"correlation_id: {key}\n{POST_OPEN}{encode_post(text)}{POST_CLOSE}"


def framed_post(user: str) -> str | None:
    """The encoded post of a message ``framed`` built (None: not one of ours)."""
    start, end = user.find(POST_OPEN), user.rfind(POST_CLOSE)
    if start < 0 or end < start + len(POST_OPEN):
        return None
    return user[start + len(POST_OPEN) : end]
