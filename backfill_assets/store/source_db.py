"""Reading posts from the platform's own database: its query, streamed (the source side of
``import --sql``).

The query is the operator's; it is wrapped, never edited: ``SELECT <needed columns> FROM
(<query>) AS backfill_source``, with, for an incremental source, the rows after the high-water
mark in (cursor, tenant, post) order. On PostgreSQL the rows come through a server-side cursor
in a read-only transaction, so memory follows the batch and not the table.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from backfill_assets.core.urls import redact_url
from backfill_assets.store.platform_db import PlatformDbError, failure_text, platform_engine

SUBQUERY = "backfill_source"


class SourceError(PlatformDbError):
    """The source cannot be read: its URL, its query, or a cursor value of an unusable type.
    The message never holds the URL's password."""


@dataclass(frozen=True, slots=True)
class CursorMark:
    """The last row an incremental import committed: its cursor value and its post."""

    value: Any
    tenant_id: str | None
    post_id: str


@dataclass(frozen=True)
class KeyColumns:
    """The query's columns that order an incremental read (tenant: ``None`` when the import is
    bound to one tenant and the query has no tenant column)."""

    cursor: str
    tenant: str | None
    post: str


def encode_cursor(value: Any) -> str:
    """A cursor value as JSON text that ``decode_cursor`` turns back into the same type."""
    if isinstance(value, bool):
        raise SourceError("a cursor column of booleans cannot order rows")
    if isinstance(value, dt.datetime):
        return json.dumps({"type": "datetime", "value": value.isoformat()})
    if isinstance(value, dt.date):
        return json.dumps({"type": "date", "value": value.isoformat()})
    if isinstance(value, int):
        return json.dumps({"type": "int", "value": str(value)})
    if isinstance(value, Decimal):
        return json.dumps({"type": "decimal", "value": str(value)})
    if isinstance(value, float):
        return json.dumps({"type": "float", "value": repr(value)})
    if isinstance(value, str):
        return json.dumps({"type": "str", "value": value})
    raise SourceError(
        f"cursor values of type {type(value).__name__} cannot be kept as a high-water mark; "
        "use a timestamp, date, number or text column"
    )


def decode_cursor(text: str) -> Any:
    """The value ``encode_cursor`` stored."""
    doc = json.loads(text)
    kind, raw = doc["type"], doc["value"]
    parse: dict[str, Any] = {
        "datetime": dt.datetime.fromisoformat,
        "date": dt.date.fromisoformat,
        "int": int,
        "decimal": Decimal,
        "float": float,
        "str": str,
    }
    return parse[kind](raw)


def cursor_text(value: Any) -> str:
    """A cursor value as shown (messages, rejects, ``import --json``)."""
    return value.isoformat() if isinstance(value, dt.date) else str(value)


def _failure(url: str, exc: Exception) -> SourceError:
    """A driver's error as a message naming the source, never its password."""
    return SourceError(f"source {redact_url(url)}: {failure_text(url, exc)}")


def _subquery(query: str, columns: Sequence[str]) -> Any:
    # Colons escaped: the operator's SQL has no bind parameters, and '10:30' is not one.
    body = query.strip().rstrip(";").replace(":", "\\:")
    return sa.text(body).columns(*(sa.column(c) for c in columns)).subquery(SUBQUERY)


def query_columns(url: str, query: str) -> list[str]:
    """The columns the query returns (run with no rows: nothing is read)."""
    body = query.strip().rstrip(";").replace(":", "\\:")
    probe = sa.select(sa.text("*")).select_from(sa.text(f"({body}) AS {SUBQUERY}"))
    engine = platform_engine(url, SourceError)
    try:
        with engine.connect() as conn:
            _read_only(conn)
            result = conn.execute(probe.where(sa.false()))
            return [str(k) for k in result.keys()]  # noqa: SIM118 (a Result, not a dict)
    except sa.exc.SQLAlchemyError as exc:
        raise _failure(url, exc) from None
    finally:
        engine.dispose()


def _read_only(conn: sa.Connection) -> None:
    """The import only reads: a query that would write fails instead."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET TRANSACTION READ ONLY")
    elif conn.dialect.name == "sqlite":
        conn.exec_driver_sql("PRAGMA query_only = 1")


def _after(sub: Any, keys: KeyColumns, mark: CursorMark) -> sa.ColumnElement[bool]:
    """Rows after ``mark`` in (cursor, tenant, post) order, spelled out so every database
    reads it (no row-value comparison); rows with a NULL key are always read, to be rejected."""
    c, p = sub.c[keys.cursor], sub.c[keys.post]
    cv: Any = sa.bindparam("mark_cursor", mark.value)
    pv: Any = sa.bindparam("mark_post", mark.post_id)
    if keys.tenant is None or mark.tenant_id is None:
        tail = p > pv
        nulls = [c.is_(None), p.is_(None)]
    else:
        t, tv = sub.c[keys.tenant], sa.bindparam("mark_tenant", mark.tenant_id, type_=sa.Text)
        tail = sa.or_(t > tv, sa.and_(t == tv, p > pv))
        nulls = [c.is_(None), t.is_(None), p.is_(None)]
    return sa.or_(c > cv, sa.and_(c == cv, tail), *nulls)


def stream_rows(
    url: str,
    query: str,
    columns: Sequence[str],
    batch_rows: int,
    keys: KeyColumns | None = None,
    mark: CursorMark | None = None,
) -> Generator[list[tuple[Any, ...]]]:
    """The query's ``columns``, in chunks of ``batch_rows``; ordered by ``keys`` and after
    ``mark`` for an incremental source."""
    sub = _subquery(query, columns)
    stmt = sa.select(*(sub.c[c] for c in columns))
    if keys is not None:
        tenant = [sub.c[keys.tenant]] if keys.tenant else []
        stmt = stmt.order_by(sub.c[keys.cursor], *tenant, sub.c[keys.post])
        if mark is not None:
            stmt = stmt.where(_after(sub, keys, mark))
    engine = platform_engine(url, SourceError)
    try:
        with engine.connect() as conn:
            _read_only(conn)
            streaming = conn.execution_options(stream_results=True, yield_per=batch_rows)
            result = streaming.execute(stmt)
            for part in result.partitions(batch_rows):
                yield [tuple(r) for r in part]
    except sa.exc.SQLAlchemyError as exc:
        raise _failure(url, exc) from None
    finally:
        engine.dispose()
