"""One migrated engine per store URL per process, forgotten in a forked child."""

from __future__ import annotations

import os
import threading

from sqlalchemy.engine import Engine

from backfill_assets.config.variables import DEFAULT_DEAD_PEER_SECONDS, StoreSettings
from backfill_assets.ledger.dead_peer import DeadPeer
from backfill_assets.ledger.engine import make_engine
from backfill_assets.ledger.migrate import migrate

# Keyed by (URL, dead-peer seconds): one engine per store and TCP setting per process.
_engines: dict[tuple[str, float], Engine] = {}
_engines_lock = threading.Lock()


def _forget_engines() -> None:
    """In a forked child (``runner/processes.py``): the parent's pooled connections are the
    parent's; drop them unclosed (closing would end the parent's sessions) and start afresh."""
    global _engines_lock
    for engine in _engines.values():
        engine.dispose(close=False)
    _engines.clear()
    _engines_lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_forget_engines)


def dispose_engines() -> None:
    """Close every engine's pooled connections (the CLI, as it exits)."""
    with _engines_lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()


def dispose_engine(url: str) -> None:
    """Close and forget the engines of one store URL (tests, before dropping a database)."""
    with _engines_lock:
        for key in [k for k in _engines if k[0] == url]:
            _engines.pop(key).dispose()


def engine_for(url: str, dead_peer_seconds: float = DEFAULT_DEAD_PEER_SECONDS) -> Engine:
    """One migrated engine per URL (and ``BACKFILL_PG_DEAD_PEER_SECONDS``) per process."""
    with _engines_lock:
        engine = _engines.get((url, dead_peer_seconds))
        if engine is None:
            engine = make_engine(url, DeadPeer(dead_peer_seconds))
            migrate(engine)
            _engines[(url, dead_peer_seconds)] = engine
        return engine


def store_engine(store: StoreSettings) -> Engine:
    """The migrated engine of the store the settings name (the ``store`` resource)."""
    return engine_for(store.url, store.pg_dead_peer_seconds)
