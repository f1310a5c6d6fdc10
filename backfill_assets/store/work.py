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


def _same_work(table: sa.Table, versions: Versions) -> sa.ColumnElement[bool]:
    return sa.and_(
        table.c.tenant_id == posts.c.tenant_id,
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
    return (
        sa.select(posts.c.post_id, posts.c.content_hash, posts.c.text)
        .where(posts.c.tenant_id == tenant_id, posts.c.slice == slice_no, ~done, ~dead)
        .order_by(posts.c.post_id)
    )


def pending_posts(
    conn: Connection, tenant_id: str, slice_no: int, versions: Versions
) -> list[PendingPost]:
    """The partition's remaining work (bounded by one slice)."""
    rows = conn.execute(pending_query(tenant_id, slice_no, versions))
    return [PendingPost(r.post_id, r.content_hash, r.text) for r in rows]


def partition_size(conn: Connection, tenant_id: str, slice_no: int) -> int:
    """Number of posts in a partition."""
    stmt = sa.select(sa.func.count()).where(
        posts.c.tenant_id == tenant_id, posts.c.slice == slice_no
    )
    return int(conn.execute(stmt).scalar_one())


class PartitionBusy(RuntimeError):
    """Another process holds the writer lock of this partition."""


_local_locks: dict[str, threading.Lock] = {}
_local_guard = threading.Lock()


def _lock_name(tenant_id: str, slice_no: int) -> str:
    return f"{tenant_id}.s{slice_no:02d}"


@contextlib.contextmanager
def partition_lock(engine: Engine, tenant_id: str, slice_no: int) -> Iterator[None]:
    """Exclusive writer lock, released by the OS/server when the holder dies (even SIGKILL)."""
    name = _lock_name(tenant_id, slice_no)
    if is_sqlite(engine):
        with _file_lock(engine, name):
            yield
        return
    lock_id = int.from_bytes(
        hashlib.sha256(f"backfill:{name}".encode()).digest()[:8], "big", signed=True
    )
    with engine.connect() as conn:
        # A session lock (not a transaction lock): held while this connection lives.
        got = conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": lock_id}).scalar_one()
        conn.commit()
        if not got:
            raise PartitionBusy(f"partition {name} is being written by another process")
        try:
            yield
        finally:
            conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": lock_id})
            conn.commit()


@contextlib.contextmanager
def _file_lock(engine: Engine, name: str) -> Iterator[None]:
    db = engine.url.database
    if db in (None, "", ":memory:"):
        with _local_guard:
            lock = _local_locks.setdefault(name, threading.Lock())
        if not lock.acquire(blocking=False):
            raise PartitionBusy(f"partition {name} is being written by another thread")
        try:
            yield
        finally:
            lock.release()
        return
    lock_dir = Path(f"{db}.locks")
    lock_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_dir / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PartitionBusy(f"partition {name} is being written by another process") from None
        yield
    finally:
        os.close(fd)
