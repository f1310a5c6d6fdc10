"""``decisions import --sql URL --query Q [--source NAME] [--cursor COL]``: moderators'
decisions straight from the platform's database, read by the posts import's source (one
read-only statement, streamed) and written like a file's rows.

Without a cursor every import reads what the query returns, and what was imported before
counts unchanged. With one the import is incremental as the posts import is
(``sql_import.py``): the source's high-water mark (cursor, tenant, post of the last row
committed) moves in each batch's transaction, and the next import reads from the mark's
cursor value on, that value included; the rows read again count unchanged. The mark is kept
apart from the posts import's marks (``decisions:NAME``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection, Engine

from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.work.records import Record, Rejection, shown
from backfill_assets.ingest.decisions import (
    DecisionOptions,
    Progress,
    column_of,
    to_decision,
    wanted_columns,
    write_all,
)
from backfill_assets.ingest.formats import ImportInputError
from backfill_assets.ledger.decisions.store import Decision, DecisionsSummary, PolicyVersions
from backfill_assets.ledger.engine import write_tx
from backfill_assets.platform_db.source import (
    CursorMark,
    KeyColumns,
    SourceError,
    cursor_text,
    query_columns,
    stream_rows,
)
from backfill_assets.platform_db.source_marks import SourceMoved, open_source, save_mark
from backfill_assets.platform_db.sql_import import SOURCE_NAME_RE


@dataclass
class DecisionsFromSql:
    """What an import of decisions from a database did, and the mark it left."""

    summary: DecisionsSummary
    cursor: str | None = None
    mark: CursorMark | None = None

    def high_water(self) -> dict[str, str | None] | None:
        """The mark as shown (``--json``)."""
        if self.mark is None or self.cursor is None:
            return None
        return {
            self.cursor: cursor_text(self.mark.value),
            "tenant_id": self.mark.tenant_id,
            "post_id": self.mark.post_id,
        }


@dataclass
class _Rows:
    """Query rows as decisions and rejections, numbered on from the rows read before, with
    the marks they reach."""

    options: DecisionOptions
    needed: list[str]
    keys: KeyColumns | None
    base_line: int
    marks: deque[tuple[int, CursorMark]] = field(default_factory=deque)

    def read(self, chunks: Iterator[list[tuple[Any, ...]]]) -> Iterator[Decision | Rejection]:
        line = self.base_line
        for chunk in chunks:
            for values in chunk:
                line += 1
                yield self._one(dict(zip(self.needed, values, strict=True)), line)

    def _one(self, row: dict[str, Any], line: int) -> Decision | Rejection:
        post = row.get(column_of(self.options.columns, "post_id"))
        where = f"post_id {shown(post)!r}"
        keys = self.keys
        if keys is not None:
            value = row[keys.cursor]
            where += f", {keys.cursor} {shown(cursor_text(value))}"
            if value is None:
                why = f"{keys.cursor} is NULL: an incremental import needs a cursor value"
                return Rejection(line, why, self.options.tenant, where)
            tenant = row[keys.tenant] if keys.tenant else self.options.tenant
            if isinstance(post, str) and isinstance(tenant, str):
                self.marks.append((line, CursorMark(value, tenant, post)))
        return to_decision(Record(line, row, where), self.options, None)

    def mark_upto(self, last_line: int) -> CursorMark | None:
        """The mark of the last markable row at or before ``last_line`` (popped)."""
        mark = None
        while self.marks and self.marks[0][0] <= last_line:
            mark = self.marks.popleft()[1]
        return mark


def _keys(cursor: str | None, found: Sequence[str], options: DecisionOptions) -> KeyColumns | None:
    if cursor is None:
        return None
    if cursor not in found:
        columns = ", ".join(shown(c) for c in found[:20])
        raise ImportInputError(f"--cursor {shown(cursor)}: the query has no such column: {columns}")
    tenant = column_of(options.columns, "tenant_id")
    return KeyColumns(
        cursor, tenant if tenant in found else None, column_of(options.columns, "post_id")
    )


def import_decision_sql(
    engine: Engine,
    url: str,
    query: str,
    name: str,
    cursor: str | None,
    policy: Policy,
    options: DecisionOptions,
    progress: Progress | None = None,
) -> DecisionsFromSql:
    """Import the decisions the query returns (from the source's mark on, with a cursor)."""
    if not SOURCE_NAME_RE.fullmatch(name):
        raise ImportInputError(f"--source {shown(name)!r} must match {SOURCE_NAME_RE.pattern}")
    label, source = f"sql:{name}", f"decisions:{name}"
    try:
        found = query_columns(url, query)
        needed = wanted_columns(options)(found)
    except SourceError as exc:
        raise ImportInputError(str(exc)) from None
    except ImportInputError as exc:
        raise ImportInputError(f"{label}: the query's result has {exc}") from None
    keys = _keys(cursor, found, options)
    if keys is not None and keys.cursor not in needed:
        needed.append(keys.cursor)
    with write_tx(engine) as conn:
        state = open_source(conn, source, cursor)
    if state.cursor_column != cursor:
        was = state.cursor_column or "no cursor"
        raise ImportInputError(
            f"{label} was imported by {was}, not by {cursor or 'no cursor'}; a source keeps its "
            "cursor (name a new --source to start another)"
        )
    rows = _Rows(options, needed, keys, state.rows_read if keys else 0)
    holder = [state]

    def hook(conn: Connection, batch: Sequence[Decision | Rejection]) -> None:
        mark = rows.mark_upto(batch[-1].line) if keys is not None else None
        holder[0] = save_mark(conn, holder[0], mark, holder[0].rows_read + len(batch))

    summary = DecisionsSummary()
    chunks = stream_rows(url, query, needed, options.batch_rows, keys, state.mark)
    try:
        versions = PolicyVersions(policy)
        write_all(
            engine, rows.read(chunks), label, label, versions, options, summary, progress, hook
        )
    except SourceMoved as exc:
        raise ImportInputError(str(exc)) from None
    except SourceError as exc:
        raise ImportInputError(f"{exc}; the rows before it were imported") from None
    finally:
        chunks.close()  # the source's connection ends here
    return DecisionsFromSql(summary, cursor, holder[0].mark)
