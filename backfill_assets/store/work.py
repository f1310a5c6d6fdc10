"""What is left to do in a partition, and who may do it (one writer per partition)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ..keys import Versions
from .engine import is_sqlite
from .tables import dead_letters, posts, results

# Outcomes a later run must not send again without an operator's requeue or a version change.
FINAL_DEAD_OUTCOMES = ("schema_rejected", "transport_rejected")


@dataclass(frozen=True, slots=True)
class PendingPost:
    """A post of the partition with no accepted result and no final dead letter."""

    post_id: str
    content_hash: str
    text: str
    had_dead_letter: bool = False


def _same_work(table: sa.Table, versions: Versions) -> sa.ColumnElement[bool]:
    return sa.and_(
        table.c.tenant_id == posts.c.tenant_id,
        table.c.slice == posts.c.slice,
        table.c.post_id == posts.c.post_id,
        table.c.content_hash == posts.c.content_hash,
        table.c.model == versions.model,
        table.c.prompt_version == versions.prompt_version,
        table.c.task_version == versions.task_version,
    )


def pending_query(
    tenant_id: str, slice_no: int, versions: Versions
) -> sa.Select[tuple[str, str, str]]:
    """Anti-join in SQL: posts of the partition minus accepted minus finally rejected."""
    done = sa.exists().where(_same_work(results, versions))
    dead = sa.exists().where(
        _same_work(dead_letters, versions), dead_letters.c.outcome.in_(FINAL_DEAD_OUTCOMES)
    )
    # Only evaluated for rows that pass the filters: tells the writer which accepted keys
    # have a (retry_exhausted) dead letter to clear, so it skips the delete for all others.
    had_dead = sa.exists().where(_same_work(dead_letters, versions)).label("had_dead_letter")
    return sa.select(posts.c.post_id, posts.c.content_hash, posts.c.text, had_dead).where(
        posts.c.tenant_id == tenant_id, posts.c.slice == slice_no, ~done, ~dead
    )


def pending_posts(
    conn: Connection, tenant_id: str, slice_no: int, versions: Versions
) -> list[PendingPost]:
    """The partition's remaining work (bounded by one slice)."""
    rows = conn.execute(pending_query(tenant_id, slice_no, versions))
    return [PendingPost(r.post_id, r.content_hash, r.text, bool(r.had_dead_letter)) for r in rows]


class PartitionBusy(RuntimeError):
    """Another process holds the writer lock of this partition."""


_local_locks: dict[str, threading.Lock] = {}
_local_guard = threading.Lock()


def _lock_name(tenant_id: str, slice_no: int) -> str:
    return f"{tenant_id}.s{slice_no:02d}"


class WriterLocks:
    """Exclusive per-partition writer locks, released by the OS or server when the holder dies.

    PostgreSQL: session advisory locks, all on one connection (so a run over many partitions
    costs one connection). SQLite file: ``flock`` on a file per partition next to the database.
    In-memory SQLite: a process-local lock.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._conn: Connection | None = None
        self._fds: list[int] = []
        self._held_local: list[threading.Lock] = []
        self._pg_ids: list[int] = []

    def acquire(self, tenant_id: str, slice_no: int) -> None:
        """Take the lock or raise ``PartitionBusy``."""
        name = _lock_name(tenant_id, slice_no)
        if not is_sqlite(self._engine):
            self._acquire_pg(name)
            return
        db = self._engine.url.database
        if db in (None, "", ":memory:"):
            with _local_guard:
                lock = _local_locks.setdefault(name, threading.Lock())
            if not lock.acquire(blocking=False):
                raise PartitionBusy(f"partition {name} is being written by another thread")
            self._held_local.append(lock)
            return
        lock_dir = Path(f"{db}.locks")
        lock_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_dir / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PartitionBusy(f"partition {name} is being written by another process") from None
        self._fds.append(fd)

    def _acquire_pg(self, name: str) -> None:
        lock_id = int.from_bytes(
            hashlib.sha256(f"backfill:{name}".encode()).digest()[:8], "big", signed=True
        )
        if self._conn is None:
            self._conn = self._engine.connect()
        got = self._conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": lock_id})
        ok = bool(got.scalar_one())
        self._conn.commit()
        if not ok:
            raise PartitionBusy(f"partition {name} is being written by another process")
        self._pg_ids.append(lock_id)

    def release_all(self) -> None:
        """Release every lock held."""
        if self._conn is not None:
            try:
                for lock_id in self._pg_ids:
                    self._conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": lock_id})
                self._conn.commit()
            finally:
                self._conn.close()
                self._conn = None
        for fd in self._fds:
            os.close(fd)
        for lock in self._held_local:
            lock.release()
        self._fds, self._held_local, self._pg_ids = [], [], []

    def __enter__(self) -> WriterLocks:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release_all()


@contextlib.contextmanager
def partition_lock(engine: Engine, tenant_id: str, slice_no: int) -> Iterator[None]:
    """One partition's writer lock as a context manager."""
    with WriterLocks(engine) as locks:
        locks.acquire(tenant_id, slice_no)
        yield
