"""Strings a provider controls, made safe before they are stored, logged or shown.

A provider (or whatever answers at its address) writes error messages, types and codes, request
and response ids, batch and file ids and content types. Any of them may echo the request (a
tenant's post) or the API key, or be megabytes long. Nothing of it leaves the adapter without
passing through here:

- messages are cut to ``caps.PROVIDER_MESSAGE_CHARS``, quoted values and key-like tokens
  masked, and withheld whole if they still echo the request or hold a run of a secret;
- ids are kept only if they look like ids (a short run of id characters), else dropped;
- content types are kept only if they look like a media type, else named as unrecognised.

The echo check compares both sides in one normal form (``normal``): case, whitespace, control
characters, quotes and JSON escapes do not hide an echo.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator

from backfill_assets.domain.caps import PROVIDER_ID_CHARS, PROVIDER_MESSAGE_CHARS

# What is stored instead of a provider message that cannot be checked for an echo.
UNCHECKED = "(message withheld: the request text is not known to check it)"

# A run of this many normalised characters shared with the request means the provider echoed it.
ECHO_WINDOW = 16
# A run of this many characters of a secret counts as the secret.
SECRET_WINDOW = 6
WITHHELD = "(message withheld: it echoed the request)"
UNRECOGNISED_TYPE = "unrecognised content type"

_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")
_SPACE = re.compile(r"\s+")
# Key-like tokens, masked or not ("Incorrect API key provided: sk-te****1234"): never stored.
_KEY_LIKE = re.compile(r"\b(?:sk|pk|rk|key|api[_-]?key)[-_][A-Za-z0-9*._-]{2,}", re.IGNORECASE)
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:=+/-]{0," + str(PROVIDER_ID_CHARS - 1) + "}")
_MEDIA_TYPE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,63}/[a-z0-9][a-z0-9!#$&^_.+-]{0,127}")
_QUOTES = str.maketrans(
    dict.fromkeys('"`\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u00ab\u00bb', "'")
)
# A surrogate pair first (a character past U+FFFF), then any one escape.
_ESCAPE = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\(?:u[0-9a-fA-F]{4}|[\"\\/bfnrt])"
)


def _unescape(text: str) -> str:
    """JSON string escapes undone (``\\n``, ``\\"``, ``\\u00e9``): a body that embeds the post
    JSON-escaped shows the same text as one that embeds it raw."""

    def one(m: re.Match[str]) -> str:
        try:
            return str(json.loads(f'"{m.group(0)}"'))
        except ValueError:
            return m.group(0)

    return _ESCAPE.sub(one, text)


def normal(text: str) -> str:
    """The form both sides of the echo check are compared in: JSON escapes undone, NFKC, case
    folded, quotes made one, control characters and every run of whitespace one space."""
    text = unicodedata.normalize("NFKC", _unescape(text)).casefold().translate(_QUOTES)
    return _SPACE.sub(" ", _CONTROL.sub(" ", text)).strip()


def echoes(message: str, texts: Iterable[str]) -> bool:
    """True if ``message`` holds a run of ``ECHO_WINDOW`` characters of any of ``texts`` (or a
    whole short text), compared in normal form."""
    said = normal(message)
    for text in texts:
        seen = normal(text)
        if len(seen) >= ECHO_WINDOW:
            runs = {seen[i : i + ECHO_WINDOW] for i in range(len(seen) - ECHO_WINDOW + 1)}
            if any(said[i : i + ECHO_WINDOW] in runs for i in range(len(said) - ECHO_WINDOW + 1)):
                return True
        elif len(seen) >= 4 and seen in said:
            return True
    return False


def leaks(text: str, secret: str) -> bool:
    """True if ``text`` holds the secret or any run of ``SECRET_WINDOW`` of its characters."""
    if not secret:
        return False
    if len(secret) <= SECRET_WINDOW:
        return secret in text
    return any(
        secret[i : i + SECRET_WINDOW] in text for i in range(len(secret) - SECRET_WINDOW + 1)
    )


def scrub(message: str, echoes_of: Sequence[str], secrets: Sequence[str]) -> str:
    """A provider message safe to store: short, no quoted values, no key-like token, and
    withheld whole if it echoes the request or holds a run of a secret."""
    # The whole message is judged, not only the part kept: a cut can leave half an echo.
    if echoes(message, echoes_of) or any(leaks(message, s) for s in secrets):
        return WITHHELD
    text = _SPACE.sub(" ", _CONTROL.sub(" ", message)).strip()
    text = _QUOTED.sub("'…'", text)
    text = _KEY_LIKE.sub("<key>", text)
    return text[:PROVIDER_MESSAGE_CHARS]


def safe_id(value: object, secrets: Sequence[str] = ()) -> str | None:
    """A provider's id (request, response, batch, file) if it looks like one, else None."""
    if not isinstance(value, str) or not _ID.fullmatch(value):
        return None
    if _KEY_LIKE.search(value) or any(leaks(value, s) for s in secrets):
        return None
    return value


def safe_content_type(value: object) -> str:
    """The media type of a ``Content-Type`` header (parameters dropped) if it looks like one."""
    if not isinstance(value, str):
        return UNRECOGNISED_TYPE
    kind = value.split(";", 1)[0].strip().lower()
    return kind if _MEDIA_TYPE.fullmatch(kind) else UNRECOGNISED_TYPE


def require_id(value: str) -> str:
    """A provider id we must use again (a batch, a file): refused unless it looks like one."""
    if safe_id(value) is None:
        raise ValueError("not an id: expected up to 128 letters, digits and ._:=+/-")
    return value


# For pydantic models of provider answers: an id we act on must look like one; one we only
# record (a request id, a line id) is dropped when it does not.
ProviderId = Annotated[str, AfterValidator(require_id)]
RecordedId = Annotated[str | None, BeforeValidator(safe_id)]
