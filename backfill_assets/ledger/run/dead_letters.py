"""Operator actions on ``dead_letters``: keys that ended in a final outcome other than accepted."""

from __future__ import annotations

from sqlalchemy.engine import Connection

from backfill_assets.ledger.tables import dead_letters


def requeue(conn: Connection, tenant_id: str, outcome: str) -> int:
    """Delete a tenant's dead letters of one outcome, so the next run sends those keys again."""
    dl = dead_letters
    result = conn.execute(dl.delete().where(dl.c.tenant_id == tenant_id, dl.c.outcome == outcome))
    return int(result.rowcount or 0)
