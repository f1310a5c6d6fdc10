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
from collections.abc import Sequence
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
    table: sa.Table, columns: Sequence[str], rows: Sequence[dict[str, Any]]
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
    params = [compiled.params[name] for name in compiled.positiontup or ()]
    return driver_rows(conn, str(compiled), params, by_name)


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
    if not conflict and not isinstance(raw, sqlite3.Connection):
        _copy_values(raw, table, cols, values)
        return
    cursor = raw.cursor()
    try:
        if not isinstance(raw, sqlite3.Connection):
            from psycopg2.extras import execute_values

            execute_values(
                cursor,
                f"INSERT INTO {table.name} ({cols}) VALUES %s {conflict}",
                values,
                page_size=1000,
            )
        else:
            marks = ", ".join("?" for _ in columns)
            cursor.executemany(
                f"INSERT INTO {table.name} ({cols}) VALUES ({marks}) {conflict}", values
            )
    finally:
        cursor.close()


# COPY's text format: these four characters are escaped, NULL is \N (a string "\N" becomes
# "\\N", so it stays a string).
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_text(value: Any) -> str:
    if value is None:
        return "\\N"
    if isinstance(value, str):
        # translate() with a dict table looks up every character in Python: ~15 us per row of
        # ledger columns. Four C scans first; almost no value needs escaping.
        if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
            return value.translate(_COPY_ESCAPES)
        return value
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    return str(value)


def _copy_values(raw: Any, table: sa.Table, cols: str, values: Sequence[tuple[Any, ...]]) -> None:
    """PostgreSQL: plain inserts as one COPY, about half the time of a multi-row INSERT here
    (the driver quotes every value of an INSERT in Python; COPY's text rows are cheaper to
    build and to parse). Only without ON CONFLICT, which COPY does not have."""
    buf = io.StringIO()
    for row in values:
        buf.write("\t".join([_copy_text(v) for v in row]))
        buf.write("\n")
    buf.seek(0)
    cursor = raw.cursor()
    try:
        cursor.copy_expert(f"COPY {table.name} ({cols}) FROM STDIN", buf)
    finally:
        cursor.close()
