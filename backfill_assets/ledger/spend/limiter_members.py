"""Membership of processes sharing one provider endpoint's rate limit (``sql/006``)."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.ledger.dialect import insert_for
from backfill_assets.ledger.engine import write_tx
from backfill_assets.ledger.tables import limiter_members

# Seconds since the epoch on the database's clock, with sub-second precision.
_PG_NOW = "extract(epoch from clock_timestamp())"
_SQLITE_NOW = "(julianday('now') - 2440587.5) * 86400.0"


@dataclass(frozen=True, slots=True)
class Shares:
    """One member's weight against every live member's, after a heartbeat."""

    own: float
    total: float
    members: int

    @property
    def fraction(self) -> float:
        """This member's share of the endpoint's limit (1.0 when it is alone or idle)."""
        if self.own <= 0 or self.total <= 0:
            return 1.0
        return min(1.0, self.own / self.total)


def heartbeat(engine: Engine, endpoint: str, member: str, weight: float, ttl_s: float) -> Shares:
    """Record this member as live with ``weight``, drop members silent for ``ttl_s``, and
    return the weights in force (one transaction)."""
    now_sql = _SQLITE_NOW if engine.dialect.name == "sqlite" else _PG_NOW
    with write_tx(engine) as conn:
        now = float(conn.execute(sa.text(f"SELECT {now_sql}")).scalar_one())
        conn.execute(
            limiter_members.delete().where(
                limiter_members.c.endpoint == endpoint,
                limiter_members.c.heartbeat_at < now - ttl_s,
            )
        )
        stmt = insert_for(conn, limiter_members)
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=["endpoint", "member"],
                set_={"weight": stmt.excluded.weight, "heartbeat_at": stmt.excluded.heartbeat_at},
            ),
            {"endpoint": endpoint, "member": member, "weight": weight, "heartbeat_at": now},
        )
        rows = conn.execute(
            sa.select(limiter_members.c.member, limiter_members.c.weight).where(
                limiter_members.c.endpoint == endpoint
            )
        ).all()
    total = sum(float(r.weight) for r in rows)
    return Shares(own=weight, total=total, members=len(rows))


def leave(engine: Engine, endpoint: str, member: str) -> None:
    """Remove this member at once (a clean stop)."""
    with write_tx(engine) as conn:
        conn.execute(
            limiter_members.delete().where(
                limiter_members.c.endpoint == endpoint, limiter_members.c.member == member
            )
        )


def live_members(engine: Engine, ttl_s: float) -> int:
    """Processes that heartbeat any endpoint's shared limit within ``ttl_s`` (a planner's
    guess at how many ways the limit is split when this run joins)."""
    now_sql = _SQLITE_NOW if engine.dialect.name == "sqlite" else _PG_NOW
    with engine.connect() as conn:
        now = float(conn.execute(sa.text(f"SELECT {now_sql}")).scalar_one())
        found = conn.execute(
            sa.select(sa.func.count(sa.distinct(limiter_members.c.member))).where(
                limiter_members.c.heartbeat_at >= now - ttl_s
            )
        ).scalar_one()
    return int(found)
