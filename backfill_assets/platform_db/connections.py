"""Connections to the platform's own databases: where posts are read from (``import --sql``)
and where labels are written back (``BACKFILL_SINK_URL``). Their URLs are secrets: every message
names them redacted, and a driver's error text is scrubbed of the password."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from backfill_assets.config.urls import database_url, normalize_url
from backfill_assets.domain.urls import redact_url, scrub
from backfill_assets.ledger.dead_peer import DeadPeer


class PlatformDbError(ValueError):
    """A platform database cannot be used: its URL, a query, a table. The message never holds
    the URL's password."""


def platform_engine(url: str, error: type[PlatformDbError] = PlatformDbError) -> sa.Engine:
    """An engine on a platform database (no pool: one step holds one connection)."""
    try:
        parsed = database_url(normalize_url(url))
    except ValueError as exc:
        raise error(f"{redact_url(url)}: {exc}") from None
    try:
        # A host that vanishes mid-read or mid-write must fail the step in seconds, not hang
        # it for the kernel's two hours: libpq's keepalives, as on the store (dead_peer.py).
        peer = DeadPeer()
        pg = parsed.get_backend_name() == "postgresql"
        args = dict(peer.missing_client_params(dict(parsed.query))) if pg else {}
        return sa.create_engine(parsed, poolclass=NullPool, connect_args=args)
    except Exception as exc:  # an unknown dialect or driver
        raise error(f"{redact_url(url)}: {scrub(str(exc), url)}") from None


def failure_text(url: str, exc: Exception) -> str:
    """The first line of a driver's error, without the URL's secrets (at most 500 chars)."""
    inner = getattr(exc, "orig", None) or exc
    first = str(inner).strip().splitlines()[0] if str(inner).strip() else type(inner).__name__
    return scrub(first, url)[:500]
