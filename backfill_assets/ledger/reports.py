"""Read-only queries behind metadata and ``dry-run`` (usage reports: ``usage.py``)."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.domain.work.events import EventKind
from backfill_assets.ledger.run.partition_groups import Owners, claimed_by
from backfill_assets.ledger.tables import ledger_events, posts, tenants


def tenant_ids(conn: Connection) -> list[str]:
    """All registered customers' tenants (not the tenants that hold gold sets: ``evaluate``)."""
    return [
        str(t)
        for t in conn.execute(
            sa.select(tenants.c.tenant_id)
            .where(tenants.c.purpose.is_(None))
            .order_by(tenants.c.tenant_id)
        ).scalars()
    ]


def partition_spend(conn: Connection, owners: Owners) -> dict[str, dict[str, int]]:
    """Billed tokens of each partition of ``owners`` and the part paid more than once for the
    same key, in one query for them all."""
    le = ledger_events
    per_event = (
        sa.select(
            le.c.tenant_id,
            le.c.slice,
            (le.c.tokens_in + le.c.tokens_out).label("tokens"),
            sa.func.row_number().over(partition_by=le.c.key, order_by=le.c.id).label("nth"),
        )
        .where(claimed_by(le, owners), le.c.type == EventKind.USAGE)
        .subquery()
    )
    stmt = sa.select(
        per_event.c.tenant_id,
        per_event.c.slice,
        sa.func.sum(per_event.c.tokens),
        sa.func.sum(sa.case((per_event.c.nth > 1, per_event.c.tokens), else_=0)),
    ).group_by(per_event.c.tenant_id, per_event.c.slice)
    out = {key: {"billed_tokens": 0, "rebilled_tokens": 0} for key in owners.values()}
    for tenant_id, slice_no, billed, rebilled in conn.execute(stmt) if owners else ():
        spend = out[owners[(str(tenant_id), int(slice_no))]]
        spend["billed_tokens"] += int(billed or 0)
        spend["rebilled_tokens"] += int(rebilled or 0)
    return out


def live_label_counts(
    conn: Connection, tenants: Sequence[str], exclude_code_version: str | None = None
) -> dict[str, dict[str, int]]:
    """Labels in the posts' live column per tenant of ``tenants`` (the live moderation's
    judgement), in one grouped query per 5,000 tenants; a tenant with none maps to {}.

    Labels this code version wrote itself (after the live switch) are left out, or the
    baseline would drift towards the thing it is checking.
    """
    out: dict[str, dict[str, int]] = {t: {} for t in tenants}
    wanted = sorted(out)
    for i in range(0, len(wanted), 5_000):
        stmt = sa.select(posts.c.tenant_id, posts.c.moderation_label, sa.func.count()).where(
            posts.c.tenant_id.in_(wanted[i : i + 5_000]), posts.c.moderation_label.is_not(None)
        )
        if exclude_code_version is not None:
            stmt = stmt.where(
                sa.or_(
                    posts.c.moderation_rubric_version.is_(None),
                    posts.c.moderation_rubric_version != exclude_code_version,
                )
            )
        grouped = stmt.group_by(posts.c.tenant_id, posts.c.moderation_label)
        for tenant, label, n in conn.execute(grouped):
            out[str(tenant)][str(label)] = int(n)
    return out
