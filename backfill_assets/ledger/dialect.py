"""The one place where SQLite and PostgreSQL statements differ."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection


def insert_for(conn: Connection, table: sa.Table) -> Any:
    """A dialect insert with ``on_conflict_do_nothing``/``on_conflict_do_update``."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)
