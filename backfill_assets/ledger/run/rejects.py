"""``rejected_records``: refused import lines, with line number and reason, never the text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.domain.caps import REASON_CHARS
from backfill_assets.domain.work.records import Rejection
from backfill_assets.ledger.dialect import insert_for
from backfill_assets.ledger.tables import rejected_records, utcnow


@dataclass(frozen=True)
class RejectsPage:
    """Up to ``limit`` rejected lines in (source, line) order, and how many matched in all."""

    rows: list[dict[str, object]]
    total: int


def record_rejects(conn: Connection, source: str, rejects: Sequence[Rejection]) -> int:
    """Upsert rejects by (source, line); returns how many rows were not recorded before."""
    if not rejects:
        return 0
    lines = sorted({r.line for r in rejects})
    rr = rejected_records
    known = set(
        conn.execute(
            sa.select(rr.c.line).where(
                rr.c.source == source, rr.c.line.between(lines[0], lines[-1])
            )
        ).scalars()
    )
    stmt = insert_for(conn, rr)
    stmt = stmt.on_conflict_do_update(
        index_elements=["source", "line"],
        set_={
            "reason": stmt.excluded.reason,
            "tenant_given": stmt.excluded.tenant_given,
            "locator": stmt.excluded.locator,
        },
    )
    now = utcnow()
    conn.execute(
        stmt,
        [
            {
                "source": source,
                "line": r.line,
                "reason": r.reason[:REASON_CHARS],
                "tenant_given": r.tenant_given,
                "locator": r.locator,
                "at": now,
            }
            for r in rejects
        ],
    )
    # A run of rows refused as one (``records.merge_runs``) counts its rows.
    return sum({r.line: r.rows for r in rejects if r.line not in known}.values())


def list_rejects(
    conn: Connection,
    tenant: str | None = None,
    sources: Sequence[str] = (),
    limit: int = 0,
) -> RejectsPage:
    """Rejected lines, optionally of one given tenant value and some sources; ``limit`` 0: all."""
    rr = rejected_records
    where: list[sa.ColumnElement[bool]] = []
    if tenant is not None:
        where.append(rr.c.tenant_given == tenant)
    if sources:
        where.append(rr.c.source.in_(list(sources)))
    total = int(conn.execute(sa.select(sa.func.count()).select_from(rr).where(*where)).scalar_one())
    stmt = (
        sa.select(rr.c.source, rr.c.line, rr.c.locator, rr.c.tenant_given, rr.c.reason, rr.c.at)
        .where(*where)
        .order_by(rr.c.source, rr.c.line)
    )
    if limit > 0:
        stmt = stmt.limit(limit)
    rows: list[dict[str, object]] = [
        {
            "source": r.source,
            "line": int(r.line),
            "locator": r.locator,
            "tenant": r.tenant_given,
            "reason": r.reason,
            "at": r.at.isoformat(timespec="seconds") + "Z",
        }
        for r in conn.execute(stmt)
    ]
    return RejectsPage(rows=rows, total=total)


def reject_sources(conn: Connection) -> list[str]:
    """Every source file that has rejected lines."""
    rr = rejected_records
    return [str(s) for s in conn.execute(sa.select(rr.c.source).distinct()).scalars()]


def rejected_tenant_values(conn: Connection) -> list[str]:
    """Every tenant value given on a rejected line (possibly not a valid tenant id)."""
    rr = rejected_records
    stmt = sa.select(rr.c.tenant_given).where(rr.c.tenant_given.is_not(None)).distinct()
    return [str(t) for t in conn.execute(stmt).scalars()]
