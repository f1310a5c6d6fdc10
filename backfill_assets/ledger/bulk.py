"""Fast multi-row inserts and reads on the driver connection (the writer's and the checks'
hot paths).

SQLAlchemy's per-row parameter processing costs more than the insert itself at thousands of
rows per second, so the writer hands tuples straight to the driver inside the same transaction.
Statements are built from the table metadata, never from data. Reads of many rows on SQLite
skip SQLAlchemy's row objects the same way (``select_rows``).
"""

from __future__ import annotations

import io
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from operator import itemgetter
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

AnySelect = sa.Select[*tuple[Any, ...]]


def db_time(dialect: str, when: datetime) -> Any:
    """A timestamp parameter as SQLAlchemy would have bound it for this dialect."""
    if dialect == "sqlite":
        return when.strftime("%Y-%m-%d %H:%M:%S.%f")
    return when


def insert_rows(
    conn: Connection | Any,
    table: sa.Table,
    columns: Sequence[str],
    rows: Sequence[dict[str, Any]],
    conflict: str = "",
) -> None:
    """INSERT ``rows`` (dicts holding at least ``columns``); ``conflict`` is an ON CONFLICT clause.

    ``conn`` is a SQLAlchemy connection or a raw DBAPI connection (sqlite3 or psycopg2).
    """
    if not rows:
        return
    insert_values(conn, table, columns, row_values(table, columns, rows), conflict)


def row_values(
    table: sa.Table, columns: Sequence[str], rows: Sequence[Mapping[str, Any]]
) -> list[tuple[Any, ...]]:
    """The parameter tuples of ``rows`` for ``insert_values`` (built before a write lock)."""
    unknown = [c for c in columns if c not in table.c]
    if unknown:
        raise ValueError(f"{table.name} has no column(s) {unknown}")
    pick = itemgetter(*columns)
    return [pick(r) for r in rows] if len(columns) > 1 else [(pick(r),) for r in rows]


def select_rows(conn: Connection, stmt: AnySelect, by_name: bool = False) -> list[Any]:
    """Every row of ``stmt``: tuples, or (``by_name``) rows read as ``row["column"]``.

    On SQLite the statement is compiled by SQLAlchemy and run on the driver: its rows are
    sqlite3's own (plain tuples, or ``sqlite3.Row`` with name lookup in C), about half the
    cost of SQLAlchemy's. Columns come back as the driver gives them: fine for text and
    numbers, not for types SQLAlchemy converts (timestamps, JSON).
    """
    if conn.dialect.name != "sqlite":
        result = conn.execute(stmt)
        return list(result.mappings().all() if by_name else result.all())
    compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    # ``compiled.params`` builds the whole mapping on each access: read it once, not once a
    # parameter (a group's IN list of 1,000 keys made that quadratic).
    values = compiled.params
    params = [values[name] for name in compiled.positiontup or ()]
    return driver_rows(conn, str(compiled), params, by_name)


def stream_rows(conn: Connection, stmt: AnySelect, batch_rows: int) -> Iterator[Any]:
    """The rows of ``stmt`` read as ``row["column"]``, fetched ``batch_rows`` at a time: a
    server-side cursor on PostgreSQL; on SQLite the driver's own cursor and rows (as
    ``select_rows``), which step through the result as it is read."""
    if conn.dialect.name != "sqlite":
        yield from conn.execute(stmt.execution_options(yield_per=batch_rows)).mappings()
        return
    compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    values = compiled.params
    raw = conn.connection.driver_connection
    if not isinstance(raw, sqlite3.Connection):
        raise TypeError("a SQLite connection without sqlite3 underneath")
    cursor = raw.cursor()
    cursor.row_factory = sqlite3.Row
    try:
        cursor.execute(str(compiled), [values[name] for name in compiled.positiontup or ()])
        while batch := cursor.fetchmany(batch_rows):
            yield from batch
    finally:
        cursor.close()


def driver_rows(
    conn: Connection, sql: str, params: Sequence[Any], by_name: bool = False
) -> list[Any]:
    """SQLite: every row of ``sql`` (``?`` parameters) straight from the driver."""
    raw = conn.connection.driver_connection
    if not isinstance(raw, sqlite3.Connection):
        raise TypeError("driver_rows is for SQLite connections")
    cursor = raw.cursor()
    if by_name:
        cursor.row_factory = sqlite3.Row
    try:
        return cursor.execute(sql, params).fetchall()
    finally:
        cursor.close()


def insert_values(
    conn: Connection | Any,
    table: sa.Table,
    columns: Sequence[str],
    values: Sequence[tuple[Any, ...]],
    conflict: str = "",
) -> None:
    """INSERT parameter tuples from ``row_values`` (same ``columns``)."""
    if not values:
        return
    cols = ", ".join(columns)
    raw = conn.connection.driver_connection if isinstance(conn, Connection) else conn
    if raw is None:
        raise RuntimeError("connection is closed")
    cursor = raw.cursor()
    try:
        if isinstance(raw, sqlite3.Connection):
            marks = ", ".join("?" for _ in columns)
            cursor.executemany(
                f"INSERT INTO {table.name} ({cols}) VALUES ({marks}) {conflict}", values
            )
        elif not conflict:
            _copy(cursor, table.name, cols, values)
        elif not raw.autocommit:
            _staged_copy(cursor, table, cols, values, conflict)
        else:
            from psycopg2.extras import execute_values

            execute_values(
                cursor,
                f"INSERT INTO {table.name} ({cols}) VALUES %s {conflict}",
                values,
                page_size=1000,
            )
    finally:
        cursor.close()


# COPY's text format: these four characters are escaped, NULL is \N (a string "\N" becomes
# "\\N", so it stays a string).
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_text(value: Any) -> str:
    if value is None:
        return "\\N"
    if type(value) is str:
        # translate() with a dict table looks up every character in Python: ~15 us per row of
        # ledger columns. Four C scans first; almost no value needs escaping.
        if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
            return value.translate(_COPY_ESCAPES)
        return value
    if isinstance(value, str):  # a str subclass (an enum's value): as its text
        return _copy_text(str.__str__(value))
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    return str(value)


def _copy_lines(values: Sequence[tuple[Any, ...]]) -> str:
    # The common values (plain text that needs no escape, None) inline: a function call per
    # value was most of building a flush's COPY text (1.2 million values for 30,000 keys).
    lines = [
        "\t".join(
            [
                v
                if type(v) is str and not ("\\" in v or "\t" in v or "\n" in v or "\r" in v)
                else "\\N"
                if v is None
                else _copy_text(v)
                for v in row
            ]
        )
        for row in values
    ]
    lines.append("")
    return "\n".join(lines)


def _copy(cursor: Any, target: str, cols: str, values: Sequence[tuple[Any, ...]]) -> None:
    """PostgreSQL: plain inserts as one COPY, about half the time of a multi-row INSERT here
    (the driver quotes every value of an INSERT in Python; COPY's text rows are cheaper to
    build and to parse)."""
    cursor.copy_expert(f"COPY {target} ({cols}) FROM STDIN", io.StringIO(_copy_lines(values)))


def _staged_copy(
    cursor: Any, table: sa.Table, cols: str, values: Sequence[tuple[Any, ...]], conflict: str
) -> None:
    """PostgreSQL, an insert with ON CONFLICT (which COPY does not have): COPY into a temporary
    table of the same columns, then one INSERT ... SELECT with the clause. Half the time of
    ``execute_values`` for a flush of results. The staging table lives as long as the session
    and is emptied at every commit, so it needs a transaction (the caller's)."""
    stage = f"staged_{table.name}"
    cursor.execute(
        f"CREATE TEMPORARY TABLE IF NOT EXISTS {stage} (LIKE {table.name} INCLUDING DEFAULTS)"
        " ON COMMIT DELETE ROWS"
    )
    _copy(cursor, stage, cols, values)
    cursor.execute(f"INSERT INTO {table.name} ({cols}) SELECT {cols} FROM {stage} {conflict}")
    cursor.execute(f"TRUNCATE {stage}")  # a second flush in the same transaction starts empty
