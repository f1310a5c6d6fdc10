"""Tenants' regions (set, claimed on import, read for routing) and the ``tenant list`` rows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.domain.money.nanos import usd_text
from backfill_assets.domain.work.keys import Versions
from backfill_assets.ledger.run.usage import billed_by_tenant
from backfill_assets.ledger.tables import posts, results, tenants


class UnknownTenant(LookupError):
    """``set_region`` for a tenant the store does not have."""


def tenant_regions(conn: Connection, tenant_ids: Iterable[str]) -> dict[str, str | None]:
    """The region of each known tenant among ``tenant_ids`` (``None``: no region)."""
    wanted = sorted(set(tenant_ids))
    if not wanted:
        return {}
    stmt = sa.select(tenants.c.tenant_id, tenants.c.region).where(tenants.c.tenant_id.in_(wanted))
    return {str(t): (None if r is None else str(r)) for t, r in conn.execute(stmt)}


def all_regions(conn: Connection) -> dict[str, str | None]:
    """Every tenant's region (``None``: no region)."""
    stmt = sa.select(tenants.c.tenant_id, tenants.c.region)
    return {str(t): (None if r is None else str(r)) for t, r in conn.execute(stmt)}


def set_region(conn: Connection, tenant_id: str, region: str) -> str | None:
    """Set a tenant's region (validated by the caller); returns the previous one."""
    previous = tenant_regions(conn, [tenant_id])
    if tenant_id not in previous:
        raise UnknownTenant(tenant_id)
    conn.execute(tenants.update().where(tenants.c.tenant_id == tenant_id).values(region=region))
    return previous[tenant_id]


def claim_regions(conn: Connection, claimed: Mapping[str, str]) -> None:
    """Give tenants that have no region yet the one an import line named.

    Only where the region is still unset: a region already set is never changed by an
    import (the importer rejects a line that disagrees; ``set_region`` moves a tenant).
    """
    for tenant_id, region in sorted(claimed.items()):
        conn.execute(
            tenants.update()
            .where(tenants.c.tenant_id == tenant_id, tenants.c.region.is_(None))
            .values(region=region)
        )


def tenant_rows(conn: Connection, versions: Versions) -> list[dict[str, Any]]:
    """Per tenant: region, posts, done (posts whose current text has a result at
    ``versions``), billed (tokens and dollars of every usage event, from the usage rollup)
    and the tenant's own budgets (None: none)."""
    post_n = (
        sa.select(posts.c.tenant_id, sa.func.count().label("n"))
        .group_by(posts.c.tenant_id)
        .subquery()
    )
    done_n = (
        sa.select(results.c.tenant_id, sa.func.count().label("n"))
        .select_from(
            results.join(
                posts,
                sa.and_(
                    posts.c.tenant_id == results.c.tenant_id,
                    posts.c.post_id == results.c.post_id,
                    posts.c.content_hash == results.c.content_hash,
                ),
            )
        )
        .where(
            results.c.model == versions.model,
            results.c.key_version == versions.key_version,
            results.c.task_version == versions.task_version,
        )
        .group_by(results.c.tenant_id)
        .subquery()
    )
    billed = billed_by_tenant()
    stmt = (
        sa.select(
            tenants.c.tenant_id,
            tenants.c.region,
            sa.func.coalesce(post_n.c.n, 0),
            sa.func.coalesce(done_n.c.n, 0),
            sa.func.coalesce(billed.c.n, 0),
            sa.func.coalesce(billed.c.nanos, 0),
            tenants.c.budget_tokens,
            tenants.c.budget_nanos,
        )
        .outerjoin(post_n, post_n.c.tenant_id == tenants.c.tenant_id)
        .outerjoin(done_n, done_n.c.tenant_id == tenants.c.tenant_id)
        .outerjoin(billed, billed.c.tenant_id == tenants.c.tenant_id)
        .order_by(tenants.c.tenant_id)
    )
    return [
        {
            "tenant": str(t),
            "region": r,
            "posts": int(p),
            "done": int(d),
            "billed": int(b),
            "billed_usd": usd_text(int(nanos)),
            "budget_tokens": None if cap_tokens is None else int(cap_tokens),
            "budget_usd": None if cap_nanos is None else usd_text(int(cap_nanos)),
        }
        for t, r, p, d, b, nanos, cap_tokens, cap_nanos in conn.execute(stmt)
    ]
