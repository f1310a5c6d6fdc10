"""``import --sql URL --query ... --source NAME [--cursor COL]``: posts straight from the
platform's database, validated and written like any export's rows.

With a cursor the import is incremental: the source's high-water mark is (cursor, tenant,
post) of the last row committed, moved in each batch's own transaction, and the next import
reads the rows from the mark's cursor value on, that value included, in that order. A row can
be committed after the mark with the mark's own cursor value (a batch job stamping one
``updated_at``, a ``date`` cursor): reading the value again finds it, and the rows read before
count as unchanged by their content keys (as dlt and Airbyte treat the boundary). An edited
row has a newer cursor value and is read again, and its new text is new work.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection, Engine

from backfill_assets.config.variables import ENV_SOURCE_NAME, DataSettings
from backfill_assets.domain.work.columns import ColumnMap
from backfill_assets.domain.work.keys import DEFAULT_SLICE_TARGET
from backfill_assets.domain.work.records import Post, Rejection, shown, validate_row
from backfill_assets.ingest.formats import ImportInputError
from backfill_assets.ingest.importer import (
    DEFAULT_OPTIONS,
    ImportOptions,
    Progress,
    import_rows,
)
from backfill_assets.ledger.engine import refresh_planner_stats, write_tx
from backfill_assets.ledger.run.posts import ImportSummary, raise_slice_levels
from backfill_assets.platform_db.source import (
    CursorMark,
    KeyColumns,
    SourceError,
    cursor_text,
    encode_cursor,
    query_columns,
    stream_rows,
)
from backfill_assets.platform_db.source_marks import (
    SourceMoved,
    SourceState,
    open_source,
    save_mark,
)

SOURCE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_TEXT_FIELDS = ("tenant_id", "post_id", "text")


@dataclass(frozen=True)
class SqlSource:
    """Where posts are read from; the URL is a secret (never in a repr or a message)."""

    url: str = field(repr=False)
    query: str
    name: str
    cursor: str | None = None

    @property
    def label(self) -> str:
        """How the source is named in rejects and tables."""
        return f"sql:{self.name}"


def source_of(data: DataSettings) -> SqlSource | None:
    """The posts asset's database source, if ``BACKFILL_SOURCE_URL`` names one."""
    if not data.source_url:
        return None
    return SqlSource(
        url=data.source_url,
        query=data.source_query,
        name=ENV_SOURCE_NAME,
        cursor=data.source_cursor or None,
    )


@dataclass
class SqlImport:
    """What an import from a database did, and the mark it left."""

    summary: ImportSummary
    mark: CursorMark | None
    cursor: str | None

    def high_water(self) -> dict[str, str | None] | None:
        """The mark as shown (``import --json``)."""
        if self.mark is None or self.cursor is None:
            return None
        return {
            self.cursor: cursor_text(self.mark.value),
            "tenant_id": self.mark.tenant_id,
            "post_id": self.mark.post_id,
        }


@dataclass
class _Reader:
    """Turns query rows into posts and rejections, and keeps the marks they reach."""

    source: SqlSource
    columns: ColumnMap
    tenant: str | None
    needed: list[str]
    keys: KeyColumns | None
    base_line: int
    marks: deque[tuple[int, CursorMark]] = field(default_factory=deque)
    delivered: int = 0

    def rows(self, chunks: Iterator[list[tuple[Any, ...]]]) -> Iterator[Post | Rejection]:
        for chunk in chunks:
            for values in chunk:
                self.delivered += 1
                row = dict(zip(self.needed, values, strict=True))
                if self.delivered == 1:
                    self._check_types(row)
                yield self._one(row, self.base_line + self.delivered)

    def _one(self, row: dict[str, Any], line: int) -> Post | Rejection:
        keys = self.keys
        post_id = row.get(keys.post) if keys else None
        locator = None
        if keys is not None:
            value, tenant = row[keys.cursor], row[keys.tenant] if keys.tenant else None
            locator = f"post_id {shown(post_id)!r}, {keys.cursor} {shown(cursor_text(value))}"
            if value is None:
                reason = (
                    f"{keys.cursor} is NULL: an incremental import needs a cursor value "
                    "on every row"
                )
                given = tenant if isinstance(tenant, str) else self.tenant
                return Rejection(line, reason, shown(given) if given else None, locator)
            if isinstance(post_id, str) and (keys.tenant is None or isinstance(tenant, str)):
                self.marks.append((line, CursorMark(value, tenant, post_id)))
        else:
            found = [row[c] for c in self.columns.names("post_id") if c in row]
            locator = f"post_id {shown(found[0])!r}" if found else None
        return validate_row(row, line, self.columns, self.tenant, locator)

    def _check_types(self, row: dict[str, Any]) -> None:
        """A column has one type: a first value that is not text refuses the import."""
        for name in _TEXT_FIELDS:
            for col in self.columns.names(name):
                value = row.get(col)
                if value is not None and not isinstance(value, str):
                    raise ImportInputError(
                        f"{self.source.label}: column {col} gives {type(value).__name__} "
                        f"values, not text; select it as text (CAST({col} AS TEXT) AS {col}); "
                        "nothing was imported"
                    )
        if self.keys is not None and row[self.keys.cursor] is not None:
            try:
                encode_cursor(row[self.keys.cursor])
            except SourceError as exc:
                raise ImportInputError(f"{self.source.label}: --cursor {exc}") from None

    def mark_upto(self, last_line: int) -> CursorMark | None:
        """The mark of the last markable row at or before ``last_line`` (popped)."""
        mark = None
        while self.marks and self.marks[0][0] <= last_line:
            mark = self.marks.popleft()[1]
        return mark


def _key_columns(
    source: SqlSource, columns: ColumnMap, found: Sequence[str], tenant: str | None
) -> KeyColumns | None:
    if source.cursor is None:
        return None
    if source.cursor not in found:
        raise ImportInputError(
            f"{source.label}: --cursor {shown(source.cursor)}: the query has no such column; "
            f"its columns: {', '.join(shown(c) for c in found[:20])}"
        )
    tenant_col = next((c for c in columns.names("tenant_id") if c in found), None)
    if tenant_col is None and tenant is None:
        raise ImportInputError(f"{source.label}: the query has no tenant_id column")
    post_col = next(c for c in columns.names("post_id") if c in found)
    return KeyColumns(source.cursor, tenant_col, post_col)


def import_sql(
    engine: Engine,
    source: SqlSource,
    progress: Progress | None = None,
    slice_target: int = DEFAULT_SLICE_TARGET,
    options: ImportOptions = DEFAULT_OPTIONS,
) -> SqlImport:
    """Import the query's rows (from the source's mark's cursor value on, with a cursor) into
    the store."""
    if not SOURCE_NAME_RE.fullmatch(source.name):
        shown_name = shown(source.name)
        raise ImportInputError(f"--source {shown_name!r} must match {SOURCE_NAME_RE.pattern}")
    try:
        found = query_columns(source.url, source.query)
    except SourceError as exc:
        raise ImportInputError(str(exc)) from None
    columns, tenant = options.columns, options.tenant
    problem = columns.describe_missing(found, tenant is not None)
    if problem:
        raise ImportInputError(f"{source.label}: the query's result has {problem}")
    keys = _key_columns(source, columns, found, tenant)
    needed = columns.source_columns(found)
    if keys is not None and keys.cursor not in needed:
        needed.append(keys.cursor)
    with write_tx(engine) as conn:
        state = open_source(conn, source.name, source.cursor)
    if state.cursor_column != source.cursor:
        was = state.cursor_column or "no cursor"
        raise ImportInputError(
            f"{source.label} was imported by {was}, not by {source.cursor or 'no cursor'}; "
            "a source keeps its cursor (name a new --source to start another)"
        )
    reader = _Reader(source, columns, tenant, needed, keys, state.rows_read if keys else 0)
    holder = [state]

    def hook(conn: Connection, batch: list[Post | Rejection]) -> None:
        mark = reader.mark_upto(batch[-1].line) if keys is not None else None
        holder[0] = save_mark(conn, holder[0], mark, holder[0].rows_read + len(batch))

    summary = ImportSummary()
    per_batch = options.batch_rows
    chunks = stream_rows(source.url, source.query, needed, per_batch, keys, state.mark)
    try:
        rows = reader.rows(chunks)
        import_rows(engine, rows, source.label, summary, source.label, progress, per_batch, hook)
    except SourceMoved as exc:
        raise ImportInputError(str(exc)) from None
    except SourceError as exc:
        raise ImportInputError(
            f"{exc}; the rows before it were imported"
            + ("; the next import continues after them" if keys else "")
        ) from None
    finally:
        chunks.close()  # the source's connection ends here, not whenever it is collected
        raise_slice_levels(engine, summary.tenants_seen, slice_target)
    refresh_planner_stats(engine, ("tenants", "posts"), force=bool(summary.new_tenants))
    final: SourceState = holder[0]
    return SqlImport(summary, final.mark, source.cursor)
