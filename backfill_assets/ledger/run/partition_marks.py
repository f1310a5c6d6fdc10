"""Which partitions are done at a code version, as the store saw it happen: materialised,
checked, applied (sql/017). Lets a no-op ``run`` skip idle partitions with one query instead
of reading every partition's events from the Dagster instance."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.ledger.dialect import insert_for
from backfill_assets.ledger.engine import is_sqlite
from backfill_assets.ledger.tables import partition_marks, utcnow

_CHUNK = 500  # tenants per statement (bound-parameter limits)


# (tenant, partition number, slice level)
Mark = tuple[str, int, int]


def clear(conn: Connection, partitions: Sequence[Mark]) -> None:
    """Forget the marks of partitions about to be materialised again."""
    if not partitions:
        return
    if not is_sqlite(conn.engine):
        # One statement over arrays: psycopg2 sends an executemany as one statement a row (100
        # a round trip), which the server parses and plans each: 0.55 s against 0.11 s of
        # client and server CPU for a mark and a clear of 10,000 partitions.
        conn.execute(
            _CLEAR_PG,
            {
                "tenants": [t for t, _n, _lv in partitions],
                "numbers": [n for _t, n, _lv in partitions],
            },
        )
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
    now = utcnow()
    if not is_sqlite(conn.engine):
        # A partition once (the last level given wins, as in an executemany): one INSERT may
        # not update a row twice.
        levels = {(t, n): level for t, n, level in partitions}
        conn.execute(
            _MARK_PG,
            {
                "tenants": [t for t, _n in levels],
                "numbers": [n for _t, n in levels],
                "levels": list(levels.values()),
                "code_version": code_version,
                "now": now,
            },
        )
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


# PostgreSQL: a run's partitions in one statement each, over arrays of their columns.
_CLEAR_PG = sa.text(
    "DELETE FROM partition_marks AS pm"
    " USING unnest(CAST(:tenants AS TEXT[]), CAST(:numbers AS INTEGER[])) AS u(tenant, number)"
    " WHERE pm.tenant_id = u.tenant AND pm.partition = u.number"
)
_MARK_PG = sa.text(
    "INSERT INTO partition_marks (tenant_id, partition, level, code_version, marked_at)"
    " SELECT u.tenant, u.number, u.level, :code_version, :now"
    " FROM unnest(CAST(:tenants AS TEXT[]), CAST(:numbers AS INTEGER[]),"
    " CAST(:levels AS INTEGER[])) AS u(tenant, number, level)"
    " ON CONFLICT (tenant_id, partition) DO UPDATE SET level = excluded.level,"
    " code_version = excluded.code_version, marked_at = excluded.marked_at"
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
