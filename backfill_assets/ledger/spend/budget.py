"""Budget reservations in the store: the cross-process half of the strict per-tenant caps.

A tenant's caps are its own (``tenant set-budget``: tokens, nano-dollars), else the default
token cap. In each unit, its free budget is the cap minus what it was billed, minus the
reservations of live holders (``budget_reservations``: sync runs), minus the live reservations
of its open batch chunks (``batch_submissions.reserved_tokens`` and ``reserved_nanos``, held
until the chunk is booked or closed, whoever is alive: a batch can bill after its process died).

A holder's rows live exactly as long as the holder, not as long as a lease
(``budget_holders.py``): a grant reclaims another holder's rows only when that holder is dead.
A paused or slow process keeps its money however long it is silent; a dead one's is free at
the next grant.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from backfill_assets.domain.money.budgets import Caps, Spend, grant_spend
from backfill_assets.domain.money.nanos import usd_text
from backfill_assets.ledger.dialect import insert_for
from backfill_assets.ledger.engine import is_sqlite, write_tx
from backfill_assets.ledger.run.submissions import open_reserved
from backfill_assets.ledger.spend.budget_holders import HolderLock, holder_alive
from backfill_assets.ledger.tables import budget_reservations, tenants, utcnow


@dataclass(frozen=True, slots=True)
class Grant:
    """What was added to a reservation (None: refused), what the tenant has left beyond it,
    and its caps as the grant read them."""

    granted: Spend | None
    free_after: Spend
    caps: Caps


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
        """Grow ``reservation_id`` by ``budgets.grant_spend`` (at least ``minimum``, or nothing)."""
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
