"""The keyed upsert of one batch of labels into the platform's table: rewrite a row only where
it differs, and never over a newer version of the same policy.

Three paths, one result: COPY into a staging table then one ``INSERT ... ON CONFLICT`` on
PostgreSQL with psycopg2, ``ON CONFLICT`` with bound rows on SQLite, and read-then-write on a
database without it.
"""

from __future__ import annotations

import csv
import io
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

KEY = ("tenant_id", "post_id", "policy_id")
# What a changed label rewrites; ``written_at`` follows only when one of these differs.
VALUES = (
    "label",
    "rule_ids",
    "confidence",
    "policy_version",
    "key_version",
    "model",
    "content_hash",
    "labelled_at",
)
# Columns a sink table may lack (added after tables were created): written where present.
OPTIONAL = ("p_label", "stage", "source")
# Databases with INSERT ... ON CONFLICT; others take the portable read-then-write path.
_NATIVE_UPSERT = frozenset({"postgresql", "sqlite"})


# One label row, in the sink table's column order.
SinkRow = tuple[Any, ...]


def upsert(conn: Connection, table: sa.Table, rows: list[SinkRow], newer: list[str]) -> int:
    """One batch (tuples in the table's column order) into the sink; returns the rows
    inserted or changed."""
    name = conn.dialect.name
    if name == "postgresql" and conn.dialect.driver == "psycopg2":
        return _upsert_copy(conn, table, rows, newer)
    if name not in _NATIVE_UPSERT:
        return upsert_portable(conn, table, rows, newer)
    columns = [c.name for c in table.columns]
    dicts = [dict(zip(columns, r, strict=True)) for r in rows]
    insert = postgresql.insert(table) if name == "postgresql" else sqlite.insert(table)
    # executemany of one cached statement: SQLAlchemy packs the rows into multi-row VALUES
    # ("insertmanyvalues"); RETURNING names the rows inserted or changed (a skipped one
    # returns nothing), where rowcount is not reliable for executemany.
    stmt = _on_conflict(insert, table, newer).returning(table.c.post_id)
    return len(conn.execute(stmt, dicts).all())


def values_of(table: sa.Table) -> tuple[str, ...]:
    """What a changed label rewrites in ``table``: ``VALUES`` and the optional columns it has."""
    return (*VALUES, *(c for c in OPTIONAL if c in table.c))


def _on_conflict(insert: Any, table: sa.Table, newer: list[str]) -> Any:
    """``insert`` as the keyed upsert: rewrite only what differs, never a newer version's."""
    excluded = insert.excluded
    values = values_of(table)
    differs = sa.or_(*(table.c[c].is_distinct_from(excluded[c]) for c in values))
    # One comparison per newer version, not NOT IN: an expanding list cannot be executemany'd.
    guard = sa.and_(differs, *(table.c.key_version != v for v in newer))
    return insert.on_conflict_do_update(
        index_elements=[table.c[c] for c in KEY],
        set_={**{c: excluded[c] for c in values}, "written_at": excluded.written_at},
        where=guard,
    )


_STAGE = "backfill_sink_stage"


def _upsert_copy(conn: Connection, table: sa.Table, rows: list[SinkRow], newer: list[str]) -> int:
    """PostgreSQL: the batch is COPYed into a temporary table shaped like the sink's columns,
    then upserted from it in one statement; several times faster than bound VALUES."""
    columns = [c.name for c in table.columns]
    stage = sa.Table(_STAGE, sa.MetaData(), *(sa.Column(c) for c in columns))
    target = sa.select(*(table.c[c] for c in columns)).where(sa.false())
    create = str(target.compile(dialect=conn.dialect))
    # Lives as long as the connection; emptied at each commit.
    conn.exec_driver_sql(
        f"CREATE TEMP TABLE IF NOT EXISTS {_STAGE} ON COMMIT DELETE ROWS AS {create} WITH NO DATA"
    )
    raw = conn.connection.driver_connection
    assert raw is not None
    # CSV written in C; every non-number quoted, so an empty string stays '' (not NULL).
    body = io.StringIO()
    csv.writer(body, quoting=csv.QUOTE_NONNUMERIC, lineterminator="\n").writerows(rows)
    body.seek(0)
    with raw.cursor() as cur:
        # QUOTE_NONNUMERIC writes None as "": read back as NULL in the nullable columns.
        nulls = [c.name for c in table.columns if c.nullable and c.name in OPTIONAL]
        force = f", FORCE_NULL ({', '.join(nulls)})" if nulls else ""
        cur.copy_expert(
            f"COPY {_STAGE} ({', '.join(columns)}) FROM STDIN WITH (FORMAT csv{force})", body
        )
    insert = postgresql.insert(table).from_select(columns, sa.select(stage))
    return len(conn.execute(_on_conflict(insert, table, newer).returning(table.c.post_id)).all())


def upsert_portable(
    conn: Connection, table: sa.Table, batch: list[SinkRow], newer: list[str]
) -> int:
    """The same upsert for a database without ``ON CONFLICT``: read the batch's keys, update
    what differs (and no newer version holds), insert what is missing."""
    columns = [c.name for c in table.columns]
    rows = [dict(zip(columns, r, strict=True)) for r in batch]
    values = values_of(table)
    t = table.c
    tenant, policy = rows[0]["tenant_id"], rows[0]["policy_id"]
    held = {
        r.post_id: r
        for r in conn.execute(
            sa.select(t.post_id, *(t[c] for c in values)).where(
                t.tenant_id == tenant,
                t.policy_id == policy,
                t.post_id.in_([r["post_id"] for r in rows]),
            )
        )
    }
    inserts = [r for r in rows if r["post_id"] not in held]
    updates = [
        r
        for r in rows
        if r["post_id"] in held
        and held[r["post_id"]].key_version not in newer
        and any(getattr(held[r["post_id"]], c) != r[c] for c in values)
    ]
    if inserts:
        conn.execute(table.insert(), inserts)
    if updates:
        key = sa.and_(*(t[c] == sa.bindparam(f"k_{c}") for c in KEY))
        conn.execute(
            table.update()
            .where(key)
            .values({c: sa.bindparam(f"v_{c}") for c in (*values, "written_at")}),
            [
                {
                    **{f"k_{c}": r[c] for c in KEY},
                    **{f"v_{c}": r[c] for c in (*values, "written_at")},
                }
                for r in updates
            ],
        )
    return len(inserts) + len(updates)
