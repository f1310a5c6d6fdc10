"""Budget holders: a process's reservations live exactly as long as the process.

Before its first reservation a holder takes a lock named after itself (a PostgreSQL session
advisory lock, an ``flock`` next to the SQLite file, a set for an in-memory store), which the
server or the OS drops when the process dies. ``holder_alive`` asks whether that lock is still
held: only a dead holder's reservations may be reclaimed.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from backfill_assets.ledger.engine import is_sqlite
from backfill_assets.ledger.locks.sqlite_files import lock_dir

# Holders of an in-memory SQLite store: it dies with its process, so a set is enough.
_memory_holders: set[str] = set()
_memory_guard = threading.Lock()


def _pg_key(holder: str) -> int:
    digest = hashlib.sha256(f"backfill-budget:{holder}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _memory(engine: Engine) -> bool:
    return is_sqlite(engine) and engine.url.database in (None, "", ":memory:")


def _lock_path(engine: Engine, holder: str) -> Path:
    # Next to the partition locks: one folder per database file, however it was reached.
    name = hashlib.sha256(holder.encode()).hexdigest()[:32]
    return lock_dir(str(engine.url.database)) / f"budget-{name}.lock"


class HolderLost(RuntimeError):
    """A live holder's lock was lost (dropped connection): its reservations may be gone."""


class HolderLock:
    """Held by a live holder from before its first reservation until its release."""

    def __init__(self, engine: Engine, holder: str) -> None:
        self._engine = engine
        self.holder = holder
        self._conn: Connection | None = None
        self._fd: int | None = None
        self._held = False
        self._guard = threading.Lock()

    def acquire(self) -> None:
        """Take the lock (idempotent); nobody else ever takes a fresh holder's for long.

        On PostgreSQL a held lock is checked first: if its connection was dropped, the server
        released the lock and others may have reclaimed this holder's reservations, so the
        cap can no longer be promised and ``HolderLost`` stops the caller.
        """
        with self._guard:
            if self._held:
                self._verify()
                return
            if not is_sqlite(self._engine):
                self._conn = self._engine.connect()
                self._conn.execute(
                    sa.text("SELECT pg_advisory_lock(:k)"), {"k": _pg_key(self.holder)}
                )
                self._conn.commit()
            elif _memory(self._engine):
                with _memory_guard:
                    _memory_holders.add(self.holder)
            else:
                path = _lock_path(self._engine, self.holder)
                path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            self._held = True

    def _verify(self) -> None:
        if self._conn is None:
            return  # flock and in-memory locks live as long as the process
        try:
            self._conn.execute(sa.text("SELECT 1"))
            self._conn.commit()
        except sa.exc.SQLAlchemyError as exc:
            raise HolderLost(
                f"budget holder {self.holder}: its lock connection was lost ({type(exc).__name__})"
            ) from None

    def release(self) -> None:
        """Give the lock up (call after the holder's rows are gone)."""
        with self._guard:
            if not self._held:
                return
            self._held = False
            if self._conn is not None:
                try:
                    self._conn.execute(
                        sa.text("SELECT pg_advisory_unlock(:k)"), {"k": _pg_key(self.holder)}
                    )
                    self._conn.commit()
                except sa.exc.SQLAlchemyError:
                    pass  # the connection is gone, and with it the lock
                finally:
                    self._conn.close()
                    self._conn = None
            elif self._fd is not None:
                _lock_path(self._engine, self.holder).unlink(missing_ok=True)
                os.close(self._fd)
                self._fd = None
            else:
                with _memory_guard:
                    _memory_holders.discard(self.holder)


def holder_alive(engine: Engine, conn: Connection, holder: str) -> bool:
    """True while the holder's process keeps its lock (False: it died, or never took one)."""
    if not is_sqlite(engine):
        key = {"k": _pg_key(holder)}
        if not conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), key).scalar_one():
            return True
        conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), key)
        return False
    if _memory(engine):
        with _memory_guard:
            return holder in _memory_holders
    path = _lock_path(engine, holder)
    if not path.parent.is_dir():
        return False
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        path.unlink(missing_ok=True)  # the holder is gone for good: no file left behind
        return False
    finally:
        os.close(fd)
