"""The redactor reads a database URL as SQLAlchemy does: its copy of ``make_url``'s pattern is
held to ``make_url`` itself, and what it masks covers every reading of the password."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote

import pytest
import sqlalchemy as sa
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from backfill_assets.domain.urls import MASK, parse_database_url, redact_url, redact_urls_in, scrub

# Text rich in what separates a URL's parts, and any other character now and then.
_PIECE = st.sampled_from([*":/@?#[]%+=&._- ", "%40", "%2F", "%zz", "::1"])
_CHARS = st.one_of(_PIECE, st.characters(codec="utf-8"), st.sampled_from(list("ab1Z")))
_SCHEME = st.sampled_from(["postgresql", "postgresql+psycopg2", "sqlite", "mysql", "p", "p-q"])
URLISH = st.builds(
    lambda scheme, sep, rest: scheme + sep + "".join(rest),
    _SCHEME,
    st.sampled_from(["://", ":/", "//", ":", "://", "://"]),
    st.lists(_CHARS, max_size=30),
)


def _expected_query(raw: str | None) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in parse_qsl(raw or ""):
        if key in found:
            before = found[key]
            found[key] = (*before, value) if isinstance(before, tuple) else (before, value)
        else:
            found[key] = value
    return found


@settings(max_examples=600, deadline=None)
@given(URLISH)
@example("postgresql://postgres:Sup3r/Secret?x@host/db")
@example("postgresql://u:pw@[::1/db")
@example("postgresql://u:p@ss@host:5432/db?a=1&a=2&b=")
@example("postgresql://[::1]:5432/db")
@example("postgresql:/app:pw@db/x")
def test_the_copied_pattern_reads_every_url_as_make_url_does(url: str) -> None:
    parts = parse_database_url(url)
    try:
        got = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        assert parts is None
        return
    except ValueError:  # the port is not a number
        assert parts is not None and parts.port is not None
        with pytest.raises(ValueError):
            int(parts.port)
        return
    assert parts is not None
    assert got.drivername == parts.drivername
    assert got.username == (None if parts.username is None else unquote(parts.username))
    assert got.password == (None if parts.password is None else unquote(parts.password))
    assert got.host == parts.host
    assert got.port == (None if parts.port is None else int(parts.port))
    assert got.database == (None if parts.database is None else unquote(parts.database))
    assert dict(got.query) == _expected_query(parts.query)


WITH_PASSWORD = st.builds(
    lambda scheme, user, password, rest: f"{scheme}://{user}:{password}@{rest}",
    _SCHEME,
    st.text(st.sampled_from("ab@?#%"), max_size=3),
    st.lists(_CHARS, max_size=12).map("".join),
    st.lists(_CHARS, max_size=12).map("".join),
)


@settings(max_examples=400, deadline=None)
@given(WITH_PASSWORD)
def test_everything_from_the_password_to_the_last_at_is_masked(url: str) -> None:
    parts = parse_database_url(url)
    assume(parts is not None and parts.password is not None)
    assume(not any(name in url.lower() for name in ("pass", "pwd", "secret", "token")))
    assert parts is not None and parts.username is not None
    start = url.index("://") + 3 + len(parts.username) + 1
    # The same URL with a one-letter password shows the same: nothing of the password, nor of
    # what follows it up to the last '@', is left.
    assert redact_url(url) == redact_url(url[:start] + "x" + url[url.rindex("@") :])
    assert redact_url(url).startswith(url[:start] + MASK)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # The password runs to an '@', so it may hold '/', '?' or '#'.
        ("postgresql://postgres:Sup3r/Secret?x@host/db", "postgresql://postgres:***@host/db"),
        ("postgresql://app:Sup3r/Secret#1@db:5432/x", "postgresql://app:***@db:5432/x"),
        # A raw '@' in it: masked to the last '@', although SQLAlchemy reads "ss@db" as the host.
        ("postgresql://app:p@ss@db:5432/x", "postgresql://app:***@db:5432/x"),
        ("postgresql://u:pw@[::1/db", "postgresql://u:***@[::1/db"),
        ("postgresql://u:@db/x", "postgresql://u:***@db/x"),
        (
            "postgresql://db/x?sslmode=require&PassWord=s3&x=1",
            "postgresql://db/x?sslmode=require&PassWord=***&x=1",
        ),
        # Text that does not parse: everything from after the scheme to the last '@'.
        ("postgresql:/app:pw@db/x", "postgresql:/***@db/x"),
        ("postgresql//app:pw@db/x", "postgresql//***@db/x"),
        (" postgresql://app:pw@db/x", " postgresql://***@db/x"),
        ("app:pw@db", "app:***@db"),
        ("not a url", "not a url"),
        ("sqlite:////var/lib/b@k.db", "sqlite:////var/lib/b@k.db"),
    ],
)
def test_urls_are_shown_as_their_consumer_reads_them(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_scrub_masks_each_form_a_driver_may_quote() -> None:
    url = "postgresql://app:Zq7@abcdef/x yz@127.0.0.1:1/db?token=t0k%20en"
    message = (
        'could not translate host name "abcdef" to address; database "x yz@127.0.0.1:1/db"; '
        f"password Zq7; token t0k en; {url}"
    )
    out = scrub(message, url)
    for secret in ("Zq7", "abcdef", "x yz", "t0k"):
        assert secret not in out, out
    assert "127.0.0.1" in out


def test_urls_inside_text_are_redacted() -> None:
    text = "could not open postgresql+psycopg2://dagster:Sup3r/s3cret@db:5432/d (timeout)"
    shown = "could not open postgresql+psycopg2://dagster:***@db:5432/d (timeout)"
    assert redact_urls_in(text) == shown
