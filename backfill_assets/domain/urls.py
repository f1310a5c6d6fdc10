"""Database URLs as they may be shown: the password and secret query parameters masked (pure).

A source, sink or store URL is a secret (it carries a password): every message that names one
shows ``redact_url(url)``, and ``scrub`` masks the password inside any text (a driver's error).

The password is found the way the consumer finds it. Every database URL here goes through
SQLAlchemy's ``make_url``, whose pattern ``parse_database_url`` copies: the user name runs to
the first ``:`` or ``/``, the password from there to the next ``@``, so it may hold ``/``,
``?`` or ``#`` (``urlsplit`` would cut it at the first of them). The mask then runs on to the
*last* ``@``: a password typed with a raw ``@`` is hidden whole, although SQLAlchemy reads its
tail as the host. Text that does not parse (``postgresql:/app:pw@db/x``) has everything from
after its scheme to the last ``@`` masked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, unquote_plus

MASK = "***"
_SECRET_PARAMS = frozenset({"password", "passwd", "pwd", "secret", "token", "sslpassword"})

# sqlalchemy.engine.url._parse_url's pattern (SQLAlchemy 2.1), copied: the core imports no
# SQLAlchemy, and deploy/redact_url.py runs before a virtualenv exists.
# backfill_tests/domain/test_urls.py holds the copy to make_url.
_SQLALCHEMY_URL = re.compile(
    r"""
        (?P<name>[\w\+]+)://
        (?:
            (?P<username>[^:/]*)
            (?::(?P<password>[^@]*))?
        @)?
        (?:
            (?:
                \[(?P<ipv6host>[^/\?]+)\] |
                (?P<ipv4host>[^/:\?]+)
            )?
            (?::(?P<port>[^/\?]*))?
        )?
        (?:/(?P<database>[^\?]*))?
        (?:\?(?P<query>.*))?
        """,
    re.X,
)
# Where a URL that does not parse keeps its text: the scheme (or a first word) and the ':'
# and '/' after it. Never a password, which only ever follows a ':' inside the user info.
_HEAD = re.compile(r"[^:/@]*[:/]*")
# A query parameter anywhere in the text: a password's and a token's values are masked.
_PARAM = re.compile(r"[?&](?P<key>[^=&?]*)=(?P<value>[^&]*)")


@dataclass(frozen=True, slots=True)
class UrlParts:
    """A database URL as SQLAlchemy's ``make_url`` reads it, each part as written (quoted);
    ``None`` for a part it does not have."""

    drivername: str
    username: str | None
    password: str | None
    host: str | None
    port: str | None
    database: str | None
    query: str | None


def parse_database_url(url: str) -> UrlParts | None:
    """``url``'s parts as ``make_url`` finds them; ``None`` where it raises ``ArgumentError``
    (a port that is not a number parses here; ``make_url`` raises ``ValueError`` for it)."""
    m = _SQLALCHEMY_URL.match(url)
    if m is None:
        return None
    return UrlParts(
        m["name"],
        m["username"],
        m["password"],
        m["ipv4host"] or m["ipv6host"],
        m["port"],
        m["database"],
        m["query"],
    )


def _password_span(url: str) -> tuple[int, int] | None:
    """Where a password may sit: from its first character to the last ``@`` (see above)."""
    last_at = url.rfind("@")
    m = _SQLALCHEMY_URL.match(url)
    if m is not None:
        return None if m["password"] is None else (m.start("password"), max(last_at, 0))
    if last_at < 0:
        return None
    head = _HEAD.match(url)
    start = head.end() if head else 0
    return (start, last_at) if start < last_at else None


def _param_spans(url: str) -> list[tuple[int, int]]:
    return [
        m.span("value")
        for m in _PARAM.finditer(url)
        if unquote_plus(m["key"]).strip().lower() in _SECRET_PARAMS
    ]


def redact_url(url: str) -> str:
    """``url`` with its password and secret query parameters replaced by ``***``."""
    spans: list[list[int]] = []
    for start, end in sorted([*filter(None, [_password_span(url)]), *_param_spans(url)]):
        if spans and start <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], end)  # a parameter inside the masked password
        else:
            spans.append([start, end])
    out, at = [], 0
    for start, end in spans:
        out += [url[at:start], MASK]
        at = end
    return "".join(out) + url[at:]


# A URL inside free text: from its scheme to the next whitespace or quote.
_IN_TEXT = re.compile(r"[\w+]+://[^\s'\"<>]+")


def redact_urls_in(text: str) -> str:
    """``text`` with every URL in it redacted (for messages that may quote a URL this code
    was not given, such as one written in a file)."""
    return _IN_TEXT.sub(lambda m: redact_url(m.group()), text)


# A shorter piece of a password split by a raw '@' is left in a driver's message: masking
# every "db" or "a" in it would make the message unreadable, and gives little away.
_MIN_PIECE = 4


def _secrets(url: str) -> set[str]:
    """Every form in which ``url``'s secrets may appear in a driver's message."""
    found: set[str] = set()
    span = _password_span(url)
    m = _SQLALCHEMY_URL.match(url)
    if span is not None:
        start, end = span
        found.add(url[start:end])
        if m is not None and m["password"] is not None:
            found.add(m["password"])
            # A raw '@' in the password: SQLAlchemy hands its tail on as the host, port or
            # database ("could not translate host name "ss@db""): mask those pieces of it.
            tail = (m.end("password") + 1, end)
            for group in ("ipv4host", "ipv6host", "port", "database"):
                if m[group] is not None:
                    piece = url[max(m.start(group), tail[0]) : min(m.end(group), tail[1])]
                    if len(piece) >= _MIN_PIECE:
                        found.add(piece)
        elif ":" in url[start:end]:
            found.add(url[start:end].partition(":")[2])  # user:password as typed
    found |= {url[s:e] for s, e in _param_spans(url)}
    return {v for s in found for v in (s, unquote(s), unquote_plus(s)) if v}


def scrub(text: str, url: str) -> str:
    """``text`` without the URL's password or secret parameters, whatever the driver put in."""
    text = text.replace(url, redact_url(url))
    for secret in sorted(_secrets(url), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
