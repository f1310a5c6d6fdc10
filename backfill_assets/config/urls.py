"""What a URL in the settings may be: the store's and the platform's database URLs as SQLAlchemy
reads them, and a model endpoint's. Errors never quote the URL: it may hold a password."""

from __future__ import annotations

from urllib.parse import urlsplit

import sqlalchemy as sa


def database_url(url: str) -> sa.URL:
    """``url`` as SQLAlchemy reads it; ``ValueError`` saying what is wrong with it (never
    quoting it: it may hold a password)."""
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        raise ValueError(
            "is not a database URL (dialect://user:password@host:port/database, sqlite:///path)"
        ) from None
    except ValueError:  # SQLAlchemy's int() of the port
        raise ValueError("is not a database URL: its port is not a number") from None
    parts = [parsed.username, parsed.password, parsed.host, parsed.database]
    for value in parsed.query.values():
        parts += [value] if isinstance(value, str) else list(value)
    if any("\x00" in p for p in parts if p):
        # A driver refuses it with a traceback ("embedded null character").
        raise ValueError("is not a database URL: it holds a NUL character (%00)")
    return parsed


def normalize_url(url: str) -> str:
    """Pin PostgreSQL URLs to psycopg2, the driver dagster-postgres is tested with."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg2://" + url[len("postgresql://") :]
    return url


def checked_model_url(value: str) -> str:
    """A model base URL we may send a key to: http(s), a host, no user or password in it (they
    would be printed and stored with the URL, and httpx would send them as Basic auth in
    place of the Bearer key)."""
    try:
        parts = urlsplit(value)
        _ = parts.port  # a port that is not a number raises here
    except ValueError:
        raise ValueError("is not a URL (https://host/v1)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host (https://host/v1)")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ValueError(
            "must not carry a user name or password: the key goes in BACKFILL_MODEL_API_KEY"
        )
    return value
