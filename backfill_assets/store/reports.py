"""Read-only queries behind metadata, ``usage`` and ``dry-run``."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..keys import Versions
from .tables import dead_letters, ledger_events, posts, results, tenants


def label_counts(
    conn: Connection, tenant_id: str, slice_no: int, versions: Versions
) -> dict[str, int]:
    """Accepted labels of a partition under the current versions."""
    stmt = (
        sa.select(results.c.label, sa.func.count())
        .where(
            results.c.tenant_id == tenant_id,
            results.c.slice == slice_no,
            results.c.model == versions.model,
            results.c.prompt_version == versions.prompt_version,
            results.c.task_version == versions.task_version,
        )
        .group_by(results.c.label)
    )
    return {str(label): int(n) for label, n in conn.execute(stmt)}


def dead_counts(
    conn: Connection, tenant_id: str, slice_no: int, versions: Versions
) -> dict[str, int]:
    """Dead letters of a partition by outcome under the current versions."""
    stmt = (
        sa.select(dead_letters.c.outcome, sa.func.count())
        .where(
            dead_letters.c.tenant_id == tenant_id,
            dead_letters.c.slice == slice_no,
            dead_letters.c.model == versions.model,
            dead_letters.c.prompt_version == versions.prompt_version,
            dead_letters.c.task_version == versions.task_version,
        )
        .group_by(dead_letters.c.outcome)
    )
    return {str(o): int(n) for o, n in conn.execute(stmt)}


def usage_by_tenant_model(conn: Connection) -> list[dict[str, object]]:
    """Tokens, cost and calls per tenant and model, from usage events."""
    le = ledger_events
    stmt = (
        sa.select(
            le.c.tenant_id,
            le.c.model,
            sa.func.count().label("calls"),
            sa.func.sum(le.c.tokens_in).label("tokens_in"),
            sa.func.sum(le.c.tokens_out).label("tokens_out"),
            sa.func.sum(le.c.cost).label("cost"),
        )
        .where(le.c.type == "usage")
        .group_by(le.c.tenant_id, le.c.model)
        .order_by(le.c.tenant_id, le.c.model)
    )
    return [
        {
            "tenant": r.tenant_id,
            "model": r.model,
            "calls": int(r.calls),
            "tokens_in": int(r.tokens_in or 0),
            "tokens_out": int(r.tokens_out or 0),
            "tokens": int((r.tokens_in or 0) + (r.tokens_out or 0)),
            "cost": round(float(r.cost or 0.0), 6),
        }
        for r in conn.execute(stmt)
    ]


def tenant_ids(conn: Connection) -> list[str]:
    """All registered tenants."""
    return [
        str(t)
        for t in conn.execute(
            sa.select(tenants.c.tenant_id).order_by(tenants.c.tenant_id)
        ).scalars()
    ]


def billed_tokens(conn: Connection) -> dict[str, int]:
    """Running billed-token totals per tenant (the budget's view)."""
    return {str(r.tenant_id): int(r.billed_tokens) for r in conn.execute(sa.select(tenants))}


def posts_for_tenants(
    conn: Connection, tenants_wanted: Sequence[str] | None
) -> sa.CursorResult[tuple[str, str, str, int]]:
    """(tenant_id, post_id, content_hash, slice) of every post, streamed in tenant order."""
    stmt = sa.select(posts.c.tenant_id, posts.c.post_id, posts.c.content_hash, posts.c.slice)
    if tenants_wanted:
        stmt = stmt.where(posts.c.tenant_id.in_(list(tenants_wanted)))
    return conn.execute(stmt.order_by(posts.c.tenant_id, posts.c.post_id))
