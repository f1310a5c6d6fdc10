"""Reading posts from the platform's own database: its query, streamed (the source side of
``import --sql``).

The query is the operator's; it is wrapped, never edited: ``SELECT <needed columns> FROM
(<query>) AS backfill_source``, with, for an incremental source, the rows from the
high-water mark's cursor value on (that value again), in (cursor, tenant, post) order.

It is one statement that only reads, held so by the database where it can be. On PostgreSQL
(psycopg2) the wrapped statement reaches the server as a string value, never as SQL, in a
read-only transaction, and the server opens it as one cursor (PL/pgSQL's ``OPEN ... FOR
EXECUTE``): a second statement, a ``COMMIT`` or a write is refused by the server before
anything runs, and the rows come a batch at a time. psycopg2 sends SQL as a script, so a
``DECLARE`` alone would not do: ``DECLARE c CURSOR FOR SELECT 1; COMMIT; CREATE TABLE ...``
runs all three. Elsewhere a separator outside literals and comments is refused
(``source_query.py``) and the transaction is read-only where the database has one (a SQLite
file is also opened read-only).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import sqlalchemy as sa
from psycopg2.extensions import encodings
from sqlalchemy.pool import NullPool

from backfill_assets.domain.urls import redact_url
from backfill_assets.platform_db.connections import PlatformDbError, failure_text, platform_engine
from backfill_assets.platform_db.source_query import second_statement

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


# PostgreSQL's answers to a query that is not one read (SQLSTATE): a cursor it cannot open (a
# second statement, a COMMIT, a CREATE) and a write in a read-only transaction.
_REFUSALS = {
    "42P11": "a source query is one statement, a SELECT: the database would not open it "
    "as one cursor",
    "25006": "a source query only reads: the database refused a write in its read-only transaction",
}


def _refusal(url: str, exc: Exception) -> SourceError | None:
    """The query refused as not one read, naming the rule and never the query."""
    reason = _REFUSALS.get(str(getattr(getattr(exc, "orig", None), "pgcode", "")))
    if reason is None:
        return None
    return SourceError(f"--query: {reason} ({failure_text(url, exc)})")


def _body(query: str) -> str:
    # Colons escaped: the operator's SQL has no bind parameters, and '10:30' is not one. The
    # line break ends a trailing '--' comment before the wrapper's parenthesis.
    return query.strip().rstrip(";").replace(":", "\\:") + "\n"


def _subquery(query: str, columns: Sequence[str]) -> Any:
    return sa.text(_body(query)).columns(*(sa.column(c) for c in columns)).subquery(SUBQUERY)


def query_columns(url: str, query: str) -> list[str]:
    """The columns the query returns (run with no rows: nothing is read)."""
    probe = sa.select(sa.text("*")).select_from(sa.text(f"({_body(query)}) AS {SUBQUERY}"))
    with _source(url, query) as conn:
        names, _rows = _open_rows(conn, probe.where(sa.false()), 1)
        return names


def _server_checked(engine: sa.Engine) -> bool:
    """Whether the server holds the query to one read (``_cursor_rows``)."""
    return engine.dialect.name == "postgresql" and engine.driver == "psycopg2"


def _source_engine(url: str) -> sa.Engine:
    """An engine on the source; a SQLite file is opened read-only (``mode=ro``: nothing can
    write it, and a missing file is not created)."""
    engine = platform_engine(url, SourceError)
    given = engine.url
    if engine.dialect.name != "sqlite" or given.database in (None, "", ":memory:"):
        return engine
    engine.dispose()
    path = str(given.database)
    uri = given.query.get("uri") in ("true", "1") and path.startswith("file:")
    database = path if uri else "file:" + quote(os.path.abspath(path))
    ro = given.set(database=database, query={**given.query, "mode": "ro", "uri": "true"})
    return sa.create_engine(ro, poolclass=NullPool)


@contextlib.contextmanager
def _source(url: str, query: str) -> Iterator[sa.Connection]:
    """A read-only connection to the source for ``query``, refused before it connects when
    the query is more than one statement and the server would not see to it."""
    engine = _source_engine(url)
    try:
        if not _server_checked(engine):
            at = second_statement(query, engine.dialect.name)
            if at is not None:
                raise SourceError(
                    f"--query: a source query is one statement: the ';' at line {at.line}, "
                    f"column {at.column} is followed by another; nothing was run"
                )
        with engine.connect() as conn:
            _read_only(conn)
            yield conn
    except sa.exc.SQLAlchemyError as exc:
        raise _refusal(url, exc) or _failure(url, exc) from None
    finally:
        engine.dispose()


def _read_only(conn: sa.Connection) -> None:
    """The import only reads: a query that would write fails instead."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET TRANSACTION READ ONLY")
    elif conn.dialect.name == "sqlite":
        conn.exec_driver_sql("PRAGMA query_only = 1")


Batches = Iterator[list[tuple[Any, ...]]]


def _open_rows(conn: sa.Connection, stmt: Any, batch_rows: int) -> tuple[list[str], Batches]:
    """The statement's column names, and its rows in batches of ``batch_rows``."""
    if _server_checked(conn.engine):
        return _cursor_rows(conn, stmt, batch_rows)
    streaming = conn.execution_options(stream_results=True, yield_per=batch_rows)
    result = streaming.execute(stmt)
    names = [str(k) for k in result.keys()]  # noqa: SIM118 (a Result, not a dict)
    return names, ([tuple(r) for r in part] for part in result.partitions(batch_rows))


# The wrapped statement reaches PostgreSQL as the value of a setting local to the read's
# transaction, and PL/pgSQL opens it as one cursor: the server parses it, and a second
# statement or anything but a query is refused (42P11) before any of it runs.
_QUERY_SETTING = "backfill.source_query"
_CURSOR = "backfill_source_rows"
_OPEN_CURSOR = (
    f"DO $$DECLARE c refcursor := '{_CURSOR}'; BEGIN "
    f"OPEN c NO SCROLL FOR EXECUTE current_setting('{_QUERY_SETTING}'); END$$"
)


def _cursor_rows(conn: sa.Connection, stmt: Any, batch_rows: int) -> tuple[list[str], Batches]:
    compiled = stmt.compile(dialect=conn.dialect)
    raw: Any = conn.connection.dbapi_connection
    with raw.cursor() as cur:
        # The statement as psycopg2 would send it, its marks' values quoted by psycopg2.
        text = cur.mogrify(str(compiled), compiled.params).decode(encodings[raw.encoding])
    conn.exec_driver_sql(
        "SELECT set_config(%(name)s, %(query)s, true)", {"name": _QUERY_SETTING, "query": text}
    )
    conn.exec_driver_sql(_OPEN_CURSOR)
    fetch = f"FETCH FORWARD {int(batch_rows)} FROM {_CURSOR}"
    first = conn.exec_driver_sql(fetch)

    def batches() -> Batches:
        rows = first.fetchall()
        while rows:
            yield [tuple(r) for r in rows]
            if len(rows) < batch_rows:
                return
            rows = conn.exec_driver_sql(fetch).fetchall()

    return [str(k) for k in first.keys()], batches()  # noqa: SIM118 (a Result, not a dict)


def _from_mark(sub: Any, keys: KeyColumns, mark: CursorMark) -> sa.ColumnElement[bool]:
    """Rows from ``mark``'s cursor value on, that value included: a row committed later with
    the mark's own value (and a (tenant, post) before the mark's) is read, and the rows read
    before count as unchanged by their content. Rows with a NULL key are always read, to be
    rejected."""
    nulls = [sub.c[keys.cursor].is_(None), sub.c[keys.post].is_(None)]
    if keys.tenant is not None:
        nulls.append(sub.c[keys.tenant].is_(None))
    return sa.or_(sub.c[keys.cursor] >= sa.bindparam("mark_cursor", mark.value), *nulls)


def stream_rows(
    url: str,
    query: str,
    columns: Sequence[str],
    batch_rows: int,
    keys: KeyColumns | None = None,
    mark: CursorMark | None = None,
) -> Generator[list[tuple[Any, ...]]]:
    """The query's ``columns``, in chunks of ``batch_rows``; ordered by ``keys`` and from
    ``mark``'s cursor value on for an incremental source."""
    sub = _subquery(query, columns)
    stmt = sa.select(*(sub.c[c] for c in columns))
    if keys is not None:
        tenant = [sub.c[keys.tenant]] if keys.tenant else []
        stmt = stmt.order_by(sub.c[keys.cursor], *tenant, sub.c[keys.post])
        if mark is not None:
            stmt = stmt.where(_from_mark(sub, keys, mark))
    with _source(url, query) as conn:
        _names, batches = _open_rows(conn, stmt, batch_rows)
        yield from batches
