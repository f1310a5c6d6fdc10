"""Budget reservations in the store: the cross-process half of the strict per-tenant cap.

A tenant's free budget is its cap minus its billed tokens, minus the reservations of live
holders (``budget_reservations``: sync runs), minus the live reservations of its open batch
chunks (``batch_submissions.reserved_tokens``, held until the chunk is booked or closed,
whoever is alive: a batch can bill after its process died).

A holder's rows live exactly as long as the holder, not as long as a lease: before its first
row is written it takes a lock named after itself (a PostgreSQL session advisory lock, an
``flock`` next to the SQLite file), which the server or the OS drops when the process dies.
A grant reclaims another holder's rows only when it can take that lock, i.e. the holder is
dead. A paused or slow process keeps its money however long it is silent; a dead one's is
free at the next grant.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from backfill_assets.core.limits import grant_size
from backfill_assets.store.dialect import insert_for
from backfill_assets.store.engine import is_sqlite, write_tx
from backfill_assets.store.locks import lock_dir
from backfill_assets.store.submissions import open_reserved
from backfill_assets.store.tables import budget_reservations, tenants, utcnow

# Holders of an in-memory SQLite store: it dies with its process, so a set is enough.
_memory_holders: set[str] = set()
_memory_guard = threading.Lock()


@dataclass(frozen=True, slots=True)
class Grant:
    """Tokens added to a reservation, and what the tenant has left beyond it."""

    granted: int
    free_after: int


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


def lock_tenant(engine: Engine, conn: Connection, tenant_id: str) -> None:
    """Serialise budget decisions per tenant across processes (SQLite's write lock already does)."""
    if not is_sqlite(engine):
        conn.execute(
            sa.select(tenants.c.tenant_id).where(tenants.c.tenant_id == tenant_id).with_for_update()
        )


def reclaim_dead(engine: Engine, conn: Connection, tenant_id: str, keep: str = "") -> int:
    """Delete the tenant's reservations whose holder died; returns the tokens freed."""
    holders = conn.execute(
        sa.select(budget_reservations.c.holder, sa.func.sum(budget_reservations.c.tokens))
        .where(budget_reservations.c.tenant_id == tenant_id, budget_reservations.c.holder != keep)
        .group_by(budget_reservations.c.holder)
    ).all()
    freed = 0
    for holder, tokens in holders:
        if not holder_alive(engine, conn, str(holder)):
            conn.execute(
                budget_reservations.delete().where(
                    budget_reservations.c.tenant_id == tenant_id,
                    budget_reservations.c.holder == holder,
                )
            )
            freed += int(tokens or 0)
    return freed


def free_tokens(conn: Connection, tenant_id: str, cap: int) -> int:
    """Cap minus billed, minus live holders' reservations, minus open batch chunks'."""
    billed = conn.execute(
        sa.select(tenants.c.billed_tokens).where(tenants.c.tenant_id == tenant_id)
    ).scalar_one_or_none()
    held = conn.execute(
        sa.select(sa.func.coalesce(sa.func.sum(budget_reservations.c.tokens), 0)).where(
            budget_reservations.c.tenant_id == tenant_id
        )
    ).scalar_one()
    return cap - int(billed or 0) - int(held) - open_reserved(conn, tenant_id)


def free_for(engine: Engine, tenant_id: str, cap: int) -> int:
    """The tenant's free budget now (dead holders' reservations reclaimed first)."""
    with write_tx(engine) as conn:
        lock_tenant(engine, conn, tenant_id)
        reclaim_dead(engine, conn, tenant_id)
        return free_tokens(conn, tenant_id, cap)


def admits(engine: Engine, conn: Connection, tenant_id: str, tokens: int, cap: int) -> bool:
    """Inside a batch chunk's intent transaction: whether its reservation fits the cap."""
    lock_tenant(engine, conn, tenant_id)
    reclaim_dead(engine, conn, tenant_id)
    return tokens <= free_tokens(conn, tenant_id, cap)


class StoreBudgetLedger:
    """Grants and releases one holder's reservations atomically against everything else."""

    def __init__(self, engine: Engine, holder: str) -> None:
        self._engine = engine
        # Unique per ledger: a lock file or advisory lock is never shared by two holders.
        self._lock = HolderLock(engine, f"{holder}:{uuid.uuid4().hex[:12]}")

    @property
    def holder(self) -> str:
        """The name this ledger's rows and lock carry."""
        return self._lock.holder

    def grant(
        self, tenant_id: str, reservation_id: str, want: int, minimum: int, cap: int
    ) -> Grant:
        """Grow ``reservation_id`` by ``limits.grant_size`` tokens (at least ``minimum``, or 0)."""
        self._lock.acquire()  # before any row of ours exists, so it is never taken for dead
        with write_tx(self._engine) as conn:
            lock_tenant(self._engine, conn, tenant_id)
            reclaim_dead(self._engine, conn, tenant_id, keep=self.holder)
            free = free_tokens(conn, tenant_id, cap)
            granted = grant_size(want, minimum, free)
            stmt = insert_for(conn, budget_reservations)
            stmt = stmt.on_conflict_do_update(
                index_elements=["reservation_id"],
                set_={
                    "tokens": budget_reservations.c.tokens + stmt.excluded.tokens,
                    "heartbeat_at": stmt.excluded.heartbeat_at,
                },
            )
            conn.execute(
                stmt,
                {
                    "reservation_id": reservation_id,
                    "tenant_id": tenant_id,
                    "tokens": granted,
                    "holder": self.holder,
                    # The last grant, for operators; liveness is the holder's lock, not this.
                    "heartbeat_at": utcnow(),
                },
            )
        return Grant(granted=granted, free_after=free - granted)

    def release(self, reservation_ids: list[str]) -> None:
        """Drop the holder's reservations once everything is settled, then its lock."""
        if reservation_ids:
            with write_tx(self._engine) as conn:
                conn.execute(
                    budget_reservations.delete().where(
                        budget_reservations.c.reservation_id.in_(reservation_ids)
                    )
                )
        self._lock.release()
