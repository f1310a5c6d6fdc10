"""Budget reservations in the store: the cross-process half of the strict per-tenant cap."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from .dialect import insert_for
from .engine import is_sqlite, write_tx
from .tables import budget_reservations, tenants, utcnow


@dataclass(frozen=True, slots=True)
class Grant:
    """Tokens added to a reservation, and what the tenant has left beyond it."""

    granted: int
    free_after: int


class StoreBudgetLedger:
    """Grants and releases reservations atomically against billed tokens and other holders."""

    def __init__(self, engine: Engine, holder: str, lease_ttl_s: float = 300.0) -> None:
        self._engine = engine
        self._holder = holder
        self._ttl = timedelta(seconds=lease_ttl_s)

    def grant(
        self, tenant_id: str, reservation_id: str, want: int, minimum: int, cap: int
    ) -> Grant:
        """Grow ``reservation_id`` by up to ``want`` tokens (at least ``minimum``, else 0)."""
        now = utcnow()
        with write_tx(self._engine) as conn:
            if not is_sqlite(self._engine):
                # Serialise grants per tenant across processes (SQLite's write lock already does).
                conn.execute(
                    sa.select(tenants.c.tenant_id)
                    .where(tenants.c.tenant_id == tenant_id)
                    .with_for_update()
                )
            conn.execute(
                budget_reservations.delete().where(
                    budget_reservations.c.tenant_id == tenant_id,
                    budget_reservations.c.heartbeat_at < now - self._ttl,
                    budget_reservations.c.reservation_id != reservation_id,
                )
            )
            billed = conn.execute(
                sa.select(tenants.c.billed_tokens).where(tenants.c.tenant_id == tenant_id)
            ).scalar_one_or_none()
            held = conn.execute(
                sa.select(sa.func.coalesce(sa.func.sum(budget_reservations.c.tokens), 0)).where(
                    budget_reservations.c.tenant_id == tenant_id
                )
            ).scalar_one()
            free = cap - int(billed or 0) - int(held)
            granted = min(want, free)
            if granted < minimum:
                granted = 0
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
                    "holder": self._holder,
                    "heartbeat_at": now,
                },
            )
        return Grant(granted=granted, free_after=free - granted)

    def release(self, reservation_ids: list[str]) -> None:
        """Drop reservations once their holder has settled everything."""
        if not reservation_ids:
            return
        with write_tx(self._engine) as conn:
            conn.execute(
                budget_reservations.delete().where(
                    budget_reservations.c.reservation_id.in_(reservation_ids)
                )
            )

    def heartbeat(self, reservation_ids: list[str]) -> None:
        """Keep live reservations from being taken for a dead holder's."""
        if not reservation_ids:
            return
        with write_tx(self._engine) as conn:
            conn.execute(
                budget_reservations.update()
                .where(budget_reservations.c.reservation_id.in_(reservation_ids))
                .values(heartbeat_at=utcnow())
            )
