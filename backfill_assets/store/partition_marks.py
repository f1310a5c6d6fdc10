"""Which partitions are done at a code version, as the store saw it happen: materialised,
checked, applied (sql/017). Lets a no-op ``run`` skip idle partitions with one query instead
of reading every partition's events from the Dagster instance."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.store.dialect import insert_for
from backfill_assets.store.tables import partition_marks, utcnow

_CHUNK = 500  # tenants per statement (bound-parameter limits)


# (tenant, partition number, slice level)
Mark = tuple[str, int, int]


def clear(conn: Connection, partitions: Sequence[Mark]) -> None:
    """Forget the marks of partitions about to be materialised again."""
    if not partitions:
        return
    pm = partition_marks
    # executemany: one statement for a run's partitions, under the store's write lock.
    stmt = pm.delete().where(
        pm.c.tenant_id == sa.bindparam("b_tenant"), pm.c.partition == sa.bindparam("b_number")
    )
    conn.execute(stmt, [{"b_tenant": t, "b_number": n} for t, n, _level in partitions])


def mark(conn: Connection, partitions: Sequence[Mark], code_version: str) -> None:
    """Partitions applied at ``code_version`` (after their blocking checks passed)."""
    if not partitions:
        return
    stmt = insert_for(conn, partition_marks)
    stmt = stmt.on_conflict_do_update(
        index_elements=["tenant_id", "partition"],
        set_={
            "level": stmt.excluded.level,
            "code_version": stmt.excluded.code_version,
            "marked_at": stmt.excluded.marked_at,
        },
    )
    now = utcnow()
    conn.execute(
        stmt,
        [
            {
                "tenant_id": tenant,
                "partition": number,
                "level": level,
                "code_version": code_version,
                "marked_at": now,
            }
            for tenant, number, level in partitions
        ],
    )


def marked(conn: Connection, code_version: str, tenants: Sequence[str] | None = None) -> set[Mark]:
    """(tenant, partition, level) marked done at ``code_version``."""
    pm = partition_marks
    base = sa.select(pm.c.tenant_id, pm.c.partition, pm.c.level).where(
        pm.c.code_version == code_version
    )
    if tenants is None:
        return {(str(t), int(p), int(lv)) for t, p, lv in conn.execute(base)}
    out: set[Mark] = set()
    names = list(tenants)
    for i in range(0, len(names), _CHUNK):
        stmt = base.where(pm.c.tenant_id.in_(names[i : i + _CHUNK]))
        out |= {(str(t), int(p), int(lv)) for t, p, lv in conn.execute(stmt)}
    return out
