"""The one place where SQLite and PostgreSQL statements differ."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection


def insert_for(conn: Connection, table: sa.Table) -> Any:
    """A dialect insert with ``on_conflict_do_nothing``/``on_conflict_do_update``."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def key_table(keys: Sequence[tuple[str, ...]], width: int) -> Any:
    """PostgreSQL: ``keys`` (text values, ``width`` each) as a table of columns ``k0``,
    ``k1``, ..., sent as one array a column (``unnest``) rather than a parameter a value."""
    arrays = [
        sa.bindparam(None, [str(k[i]) for k in keys], type_=postgresql.ARRAY(sa.Text))
        for i in range(width)
    ]
    names = [f"k{i}" for i in range(width)]
    return sa.func.unnest(*arrays).table_valued(*names).render_derived(name="wanted")


def with_keys(
    conn: Connection,
    stmt: sa.Select[Any],
    columns: Sequence[sa.ColumnElement[Any]],
    keys: Sequence[tuple[str, ...]],
) -> sa.Select[Any]:
    """``stmt`` narrowed to the rows whose ``columns`` equal one of ``keys`` (text values).

    PostgreSQL reads a row-value ``IN`` list as one OR arm per key, tried against every row a
    scan meets: joined to the keys as arrays (``key_table``), each key is one index probe, so
    a batch's reads stay flat as the table grows. SQLite looks row values up in its index.
    """
    if conn.dialect.name != "postgresql":
        return stmt.where(sa.tuple_(*columns).in_(list(keys)))
    wanted = key_table(keys, len(columns))
    on = sa.and_(*(col == wanted.c[f"k{i}"] for i, col in enumerate(columns)))
    return stmt.join(wanted, on)
