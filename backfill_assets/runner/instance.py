"""The CLI's Dagster instance: ``$DAGSTER_HOME`` opened once per command, safely when several
commands (or a run's processes) start at once on a fresh home."""

from __future__ import annotations

import fcntl
import importlib.resources
import os
from collections.abc import MutableMapping

import dagster as dg

from backfill_assets.config.settings import Settings
from backfill_assets.config.urls import database_url, normalize_url
from backfill_assets.domain.errors import UserError
from backfill_assets.domain.urls import redact_url, redact_urls_in, scrub
from backfill_assets.ledger.dead_peer import DeadPeer

# The project's dagster.yaml, shipped inside the package (a link to it in a checkout).
INSTANCE_TEMPLATE = importlib.resources.files("backfill_assets") / "instance" / "dagster.yaml"


def instance(settings: Settings) -> dg.DagsterInstance:
    """The Dagster instance of ``$DAGSTER_HOME`` (its dagster.yaml copied there if missing).

    Two commands started at once on a fresh home would both create the SQLite storages and
    stamp their migrations ("table runs already exists", two alembic heads): creation runs
    under an exclusive ``flock`` on ``$DAGSTER_HOME/.instance.lock``, released when the
    process dies.
    """
    home = settings.store.dagster_home
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".instance.lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if not (home / "dagster.yaml").exists():
            tmp = home / f".dagster.yaml.{os.getpid()}"
            tmp.write_bytes(INSTANCE_TEMPLATE.read_bytes())
            tmp.replace(home / "dagster.yaml")  # never a half-written file for another reader
        _pin_instance_driver(os.environ, DeadPeer(settings.store.pg_dead_peer_seconds))
        try:
            found = dg.DagsterInstance.from_config(str(home))
        except Exception as exc:  # a bad dagster.yaml or an unreachable database: say which
            raise UserError(
                f"cannot open the Dagster instance of {home} (DAGSTER_HOME): "
                f"{type(exc).__name__}: {_redacted(str(exc))[:300]}"
            ) from exc
    # dagster-postgres opens a new connection for every event it stores (NullPool), a few ms
    # each, and a run stores several per partition; the pooled engines the webserver uses
    # keep one open instead. No statement timeout (0): a CLI run may take long. A no-op on
    # the SQLite storages.
    found.optimize_for_webserver(statement_timeout=0, pool_recycle=3600, max_overflow=8)
    return found


def _pin_instance_driver(env: MutableMapping[str, str], peer: DeadPeer) -> None:
    """``DAGSTER_PG_URL=postgresql://...`` names no driver, and SQLAlchemy then picks psycopg
    (v3), which is not installed: pin psycopg2, as ``BACKFILL_DATABASE_URL`` is pinned. And
    give up on a silent server within the dead-peer time, as the store does: the URL is the
    only way into dagster-postgres' connections (``DeadPeer.url_with_params``)."""
    url = env.get("DAGSTER_PG_URL")
    if url:
        try:
            database_url(url)
        except ValueError as exc:
            raise UserError(f"DAGSTER_PG_URL={redact_url(url)[:80]!r}: {exc}") from None
        env["DAGSTER_PG_URL"] = peer.url_with_params(normalize_url(url))


def _redacted(text: str) -> str:
    """Database errors can quote the URL: never print its password (DAGSTER_PG_URL's, or one
    written in dagster.yaml itself)."""
    return scrub(redact_urls_in(text), os.environ.get("DAGSTER_PG_URL", ""))
