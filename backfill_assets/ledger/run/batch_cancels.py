"""How long batch cancels took, per Batch API endpoint and model (``sql/020``): the history a
deadline plan takes the time of a cancel from (``runner/deadline_plan.py``)."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.domain.urls import redact_url
from backfill_assets.ledger.dialect import insert_for
from backfill_assets.ledger.tables import batch_cancels


def endpoint_id(base_url: str) -> str:
    """The Batch API's base URL as stored and looked up (any password masked)."""
    return redact_url(base_url.rstrip("/"))


def record_cancel(
    conn: Connection,
    batch_id: str,
    endpoint: str,
    model: str,
    seconds: float,
    ended_at: dt.datetime,
) -> None:
    """Store how long ``batch_id``'s cancel took (the first observation of a batch holds)."""
    stmt = insert_for(conn, batch_cancels).values(
        batch_id=batch_id,
        endpoint=endpoint,
        model=model,
        seconds=max(0.0, seconds),
        ended_at=ended_at,
    )
    conn.execute(stmt.on_conflict_do_nothing(index_elements=["batch_id"]))


def cancel_durations(
    conn: Connection, endpoints: list[str], model: str, newest: int = 20
) -> dict[str, list[float]]:
    """Seconds the newest ``newest`` cancels of ``model`` took, per endpoint of ``endpoints``
    (an endpoint with none is absent)."""
    c = batch_cancels.c
    out: dict[str, list[float]] = {}
    for endpoint in sorted(set(endpoints)):
        rows = conn.execute(
            sa.select(c.seconds)
            .where(c.endpoint == endpoint, c.model == model)
            .order_by(c.ended_at.desc())
            .limit(newest)
        ).all()
        if rows:
            out[endpoint] = [float(r.seconds) for r in rows]
    return out
