"""Budget reservations in the store: the cross-process half of the strict per-tenant caps.

A tenant's caps are its own (``tenant set-budget``: tokens, nano-dollars), else the default
token cap. In each unit, its free budget is the cap minus what it was billed, minus the
reservations of live holders (``budget_reservations``: sync runs), minus the live reservations
of its open batch chunks (``batch_submissions.reserved_tokens`` and ``reserved_nanos``, held
until the chunk is booked or closed, whoever is alive: a batch can bill after its process died).

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

from backfill_assets.core.budgets import Caps, Spend, grant_spend
from backfill_assets.core.money import usd_text
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
    """What was added to a reservation (None: refused), what the tenant has left beyond it,
    and its caps as the grant read them."""

    granted: Spend | None
    free_after: Spend
    caps: Caps


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


def reclaim_dead(engine: Engine, conn: Connection, tenant_id: str, keep: str = "") -> None:
    """Delete the tenant's reservations whose holder died."""
    holders = conn.execute(
        sa.select(budget_reservations.c.holder)
        .where(budget_reservations.c.tenant_id == tenant_id, budget_reservations.c.holder != keep)
        .distinct()
    ).scalars()
    for holder in list(holders):
        if not holder_alive(engine, conn, str(holder)):
            conn.execute(
                budget_reservations.delete().where(
                    budget_reservations.c.tenant_id == tenant_id,
                    budget_reservations.c.holder == holder,
                )
            )


def any_caps(conn: Connection) -> bool:
    """Whether any tenant has a budget of its own (else only the default token cap can apply)."""
    stmt = (
        sa.select(tenants.c.tenant_id)
        .where(sa.or_(tenants.c.budget_tokens.is_not(None), tenants.c.budget_nanos.is_not(None)))
        .limit(1)
    )
    return conn.execute(stmt).first() is not None


def may_bind(engine: Engine, default_tokens: int | None) -> bool:
    """Whether a budget can bind in a run: the default token cap, or any tenant's own (one
    cheap query; without either, no call of the run touches the budget tables)."""
    if default_tokens:
        return True
    with engine.connect() as conn:
        return any_caps(conn)


def tenant_caps(conn: Connection, tenant_id: str, default_tokens: int | None) -> Caps:
    """The tenant's caps: its own, else the default token cap for tokens."""
    row = conn.execute(
        sa.select(tenants.c.budget_tokens, tenants.c.budget_nanos).where(
            tenants.c.tenant_id == tenant_id
        )
    ).first()
    own_tokens, own_nanos = (None, None) if row is None else (row[0], row[1])
    tokens = own_tokens if own_tokens is not None else default_tokens
    return Caps(
        tokens=None if tokens is None else int(tokens),
        nanos=None if own_nanos is None else int(own_nanos),
    )


def set_caps(conn: Connection, tenant_id: str, caps: Caps) -> None:
    """Set (or with None, remove) a tenant's own caps."""
    conn.execute(
        tenants.update()
        .where(tenants.c.tenant_id == tenant_id)
        .values(budget_tokens=caps.tokens, budget_nanos=caps.nanos)
    )


def billed(conn: Connection, tenant_id: str) -> Spend:
    """What the tenant's usage events billed, in both units."""
    row = conn.execute(
        sa.select(tenants.c.billed_tokens, tenants.c.billed_nanos).where(
            tenants.c.tenant_id == tenant_id
        )
    ).first()
    return Spend() if row is None else Spend(int(row[0]), int(row[1]))


def held(conn: Connection, tenant_id: str) -> Spend:
    """What live holders and open batch chunks hold of the tenant's budget."""
    tokens, nanos = conn.execute(
        sa.select(
            sa.func.coalesce(sa.func.sum(budget_reservations.c.tokens), 0),
            sa.func.coalesce(sa.func.sum(budget_reservations.c.nanos), 0),
        ).where(budget_reservations.c.tenant_id == tenant_id)
    ).one()
    return Spend(int(tokens), int(nanos)) + open_reserved(conn, tenant_id)


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """A tenant's caps, what it was billed, and what runs and open batches hold of it."""

    caps: Caps
    billed: Spend
    held: Spend

    @property
    def free(self) -> Spend:
        """Caps minus billed, minus what is held (meaningless in a unit without a cap)."""
        return Spend(self.caps.tokens or 0, self.caps.nanos or 0) - self.billed - self.held

    def as_dict(self) -> dict[str, object]:
        """JSON form: dollars as exact decimal strings; None where a unit has no cap."""
        caps, billed, held, free = self.caps, self.billed, self.held, self.free
        return {
            "budget_usd": None if caps.nanos is None else usd_text(caps.nanos),
            "budget_tokens": caps.tokens,
            "billed_usd": usd_text(billed.nanos),
            "billed_tokens": billed.tokens,
            "reserved_usd": usd_text(held.nanos),
            "reserved_tokens": held.tokens,
            "free_usd": None if caps.nanos is None else usd_text(free.nanos),
            "free_tokens": None if caps.tokens is None else free.tokens,
        }


def budget_status(conn: Connection, tenant_id: str, default_tokens: int | None) -> BudgetStatus:
    """The tenant's budget now (a dead run's reservations count until the next grant
    reclaims them)."""
    return BudgetStatus(
        tenant_caps(conn, tenant_id, default_tokens),
        billed(conn, tenant_id),
        held(conn, tenant_id),
    )


def settled_status(
    engine: Engine, conn: Connection, tenant_id: str, default_tokens: int | None, keep: str = ""
) -> BudgetStatus:
    """Inside a write transaction: the tenant's budget with its decisions serialised (the
    tenant's lock) and dead holders' reservations reclaimed (``keep``: the caller's own)."""
    lock_tenant(engine, conn, tenant_id)
    reclaim_dead(engine, conn, tenant_id, keep=keep)
    return budget_status(conn, tenant_id, default_tokens)


def free_for(engine: Engine, tenant_id: str, default_tokens: int | None) -> tuple[Caps, Spend]:
    """The tenant's caps and free budget now (dead holders' reservations reclaimed first)."""
    with write_tx(engine) as conn:
        status = settled_status(engine, conn, tenant_id, default_tokens)
        return status.caps, status.free


def admits(
    engine: Engine, conn: Connection, tenant_id: str, need: Spend, default_tokens: int | None
) -> bool:
    """Inside a batch chunk's intent transaction: whether its reservation fits the caps."""
    status = settled_status(engine, conn, tenant_id, default_tokens)
    return not status.caps.exceeds(need, status.free)


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

    def caps(self, tenant_id: str, default_tokens: int | None) -> Caps:
        """The tenant's caps now."""
        with self._engine.connect() as conn:
            return tenant_caps(conn, tenant_id, default_tokens)

    def grant(
        self,
        tenant_id: str,
        reservation_id: str,
        want: Spend,
        minimum: Spend,
        default_tokens: int | None,
    ) -> Grant:
        """Grow ``reservation_id`` by ``limits.grant_spend`` (at least ``minimum``, or nothing)."""
        self._lock.acquire()  # before any row of ours exists, so it is never taken for dead
        with write_tx(self._engine) as conn:
            status = settled_status(self._engine, conn, tenant_id, default_tokens, self.holder)
            caps, free = status.caps, status.free
            granted = grant_spend(want, minimum, free, caps)
            if granted is None:
                return Grant(None, free, caps)
            stmt = insert_for(conn, budget_reservations)
            stmt = stmt.on_conflict_do_update(
                index_elements=["reservation_id"],
                set_={
                    "tokens": budget_reservations.c.tokens + stmt.excluded.tokens,
                    "nanos": budget_reservations.c.nanos + stmt.excluded.nanos,
                    "heartbeat_at": stmt.excluded.heartbeat_at,
                },
            )
            conn.execute(
                stmt,
                {
                    "reservation_id": reservation_id,
                    "tenant_id": tenant_id,
                    "tokens": granted.tokens,
                    "nanos": granted.nanos,
                    "holder": self.holder,
                    # The last grant, for operators; liveness is the holder's lock, not this.
                    "heartbeat_at": utcnow(),
                },
            )
        return Grant(granted, free - granted, caps)

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
