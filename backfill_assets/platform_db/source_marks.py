"""``import_sources``: each database source's high-water mark (sql/010).

The mark moves in the transaction that commits the rows it covers, with a check that nobody
else moved it meanwhile (``rows_read`` is the token): two imports of one source at once fail
the second instead of both reading from the same mark.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.ledger.dialect import insert_for
from backfill_assets.ledger.tables import import_sources, utcnow
from backfill_assets.platform_db.source import CursorMark, decode_cursor, encode_cursor


class SourceMoved(RuntimeError):
    """Another import of the same source moved its mark while this one read."""


@dataclass(frozen=True)
class SourceState:
    """A source as the store knows it."""

    source: str
    cursor_column: str | None
    mark: CursorMark | None
    rows_read: int


def open_source(conn: Connection, source: str, cursor_column: str | None) -> SourceState:
    """The source's state, registered on first use with the cursor column it is read by."""
    stmt = insert_for(conn, import_sources).values(
        source=source, cursor_column=cursor_column, rows_read=0, updated_at=utcnow()
    )
    conn.execute(stmt.on_conflict_do_nothing())
    row = conn.execute(sa.select(import_sources).where(import_sources.c.source == source)).one()
    mark = None
    if row.cursor_value is not None and row.cursor_post_id is not None:
        mark = CursorMark(decode_cursor(row.cursor_value), row.cursor_tenant_id, row.cursor_post_id)
    return SourceState(str(row.source), row.cursor_column, mark, int(row.rows_read))


def save_mark(
    conn: Connection, state: SourceState, mark: CursorMark | None, rows_read: int
) -> SourceState:
    """Move the source to ``mark`` (``None``: keep the mark) and ``rows_read``; raises
    ``SourceMoved`` if the stored state is no longer ``state``."""
    values: dict[str, object] = {"rows_read": rows_read, "updated_at": utcnow()}
    if mark is not None:
        values |= {
            "cursor_value": encode_cursor(mark.value),
            "cursor_tenant_id": mark.tenant_id,
            "cursor_post_id": mark.post_id,
        }
    done = conn.execute(
        import_sources.update()
        .where(
            import_sources.c.source == state.source,
            import_sources.c.rows_read == state.rows_read,
        )
        .values(values)
    ).rowcount
    if done != 1:
        raise SourceMoved(
            f"source {state.source}: another import moved its mark meanwhile; "
            "this batch was not written (import again)"
        )
    return SourceState(state.source, state.cursor_column, mark or state.mark, rows_read)
