"""Database URLs as they may be shown: the password and secret query parameters masked (pure).

A source or sink URL is a secret (it carries a password): every message that names one shows
``redact_url(url)``, and ``scrub`` masks the password inside any text (a driver's error).
"""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

MASK = "***"
_SECRET_PARAMS = ("password", "passwd", "pwd", "secret", "token", "sslpassword")


def _password(url: str) -> str | None:
    netloc = urlsplit(url).netloc
    userinfo, at, _host = netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return None
    return userinfo.partition(":")[2] or None


def redact_url(url: str) -> str:
    """``url`` with its password and secret query parameters replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK
    netloc = parts.netloc
    userinfo, at, host = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:{MASK}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode(
            [(k, MASK if k.lower() in _SECRET_PARAMS else v) for k, v in pairs], safe="*/:"
        )
    if netloc == parts.netloc and query == parts.query:
        return url
    # Put together by hand: urlunsplit drops the empty host of sqlite:////path.
    out = f"{parts.scheme}://{netloc}{parts.path}"
    return out + (f"?{query}" if query else "") + (f"#{parts.fragment}" if parts.fragment else "")


def scrub(text: str, url: str) -> str:
    """``text`` without the URL's password or secret parameters, whatever the driver put in."""
    secrets: list[str] = []
    password = _password(url)
    if password:
        secrets += [password, unquote(password)]
    try:
        pairs = parse_qsl(urlsplit(url).query, keep_blank_values=True)
    except ValueError:
        pairs = []
    secrets += [v for k, v in pairs if k.lower() in _SECRET_PARAMS and v]
    text = text.replace(url, redact_url(url))
    for secret in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
