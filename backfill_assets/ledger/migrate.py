"""Run the numbered DDL files in ``sql/`` once each, in order, recorded in schema_migrations.

The files ship inside the package (``backfill_assets/migrations`` is ``sql/`` in a checkout and
package data in a wheel), so an installed package migrates its store like a checkout does.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import re
from dataclasses import dataclass
from importlib.resources.abc import Traversable

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from backfill_assets.ledger.engine import is_sqlite, write_tx
from backfill_assets.ledger.tables import utcnow

SQL_DIR: Traversable = importlib.resources.files("backfill_assets") / "migrations"
_FILE_RE = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")
# Arbitrary constant: all migrators on one PostgreSQL server serialise on it.
_PG_LOCK_ID = 0x6D6F6431


@dataclass(frozen=True)
class Migration:
    """One DDL file."""

    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        """Detects a file edited after it was run."""
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()[:16]


class MigrationError(RuntimeError):
    """The database and the files in ``sql/`` disagree."""


def load_migrations(sql_dir: Traversable = SQL_DIR) -> list[Migration]:
    """Migrations sorted by version; file names must be ``NNN_name.sql``."""
    found: list[Migration] = []
    files = (p for p in sql_dir.iterdir() if p.name.endswith(".sql"))
    for path in sorted(files, key=lambda p: p.name):
        match = _FILE_RE.match(path.name)
        if not match:
            raise MigrationError(f"{path.name}: expected a name like 001_core.sql")
        found.append(Migration(int(match[1]), match[2], path.read_text("utf-8")))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions in {sql_dir}")
    return found


def statements(sql: str, dialect: str) -> list[str]:
    """Split a DDL file into statements and fill in dialect tokens."""
    # A rowid alias, not AUTOINCREMENT: ids stay monotonic without a sqlite_sequence update
    # per insert (rows are never deleted from the tables that use it).
    serial = "INTEGER PRIMARY KEY" if dialect == "sqlite" else "BIGSERIAL PRIMARY KEY"
    body = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    body = body.replace("{serial_pk}", serial)
    # The UTC day of a ledger timestamp as 'YYYY-MM-DD' (stored as UTC without a zone).
    day = "date(at)" if dialect == "sqlite" else "to_char(at, 'YYYY-MM-DD')"
    body = body.replace("{utc_day_of_at}", day)
    # A literal ';' is written {semicolon}: statements are split on ';' first.
    out: list[str] = []
    for stmt in (s.strip().replace("{semicolon}", ";") for s in body.split(";")):
        # "@sqlite ..." / "@postgresql ...": a statement for that store only (a change the
        # two stores make differently: sql/019 swaps a CHECK on one, edits the table's
        # definition on the other).
        only, _, rest = stmt.partition(" ") if stmt.startswith("@") else ("", "", stmt)
        if stmt and (not only or only[1:] == dialect):
            out.append(rest.strip())
    return out


def _ensure_table(conn: Connection) -> None:
    conn.exec_driver_sql(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version INTEGER PRIMARY KEY, name TEXT NOT NULL, checksum TEXT NOT NULL,"
        " applied_at TIMESTAMP NOT NULL)"
    )


def migrate(engine: Engine, sql_dir: Traversable = SQL_DIR) -> list[int]:
    """Run pending migrations; returns the versions run now. Idempotent, concurrent-safe."""
    ran_now: list[int] = []
    with write_tx(engine) as conn:
        if not is_sqlite(engine):
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_ID})
        _ensure_table(conn)
        done = {
            int(r.version): str(r.checksum)
            for r in conn.execute(sa.text("SELECT version, checksum FROM schema_migrations"))
        }
        for mig in load_migrations(sql_dir):
            if mig.version in done:
                if done[mig.version] != mig.checksum:
                    raise MigrationError(
                        f"sql/{mig.version:03d}_{mig.name}.sql changed after it was run; "
                        "add a new migration instead of editing one already run"
                    )
                continue
            for stmt in statements(mig.sql, engine.dialect.name):
                if "{next_schema_version}" in stmt:  # SQLite, after editing a definition
                    now = int(conn.exec_driver_sql("PRAGMA schema_version").scalar_one())
                    stmt = stmt.replace("{next_schema_version}", str(now + 1))
                conn.exec_driver_sql(stmt)
            conn.execute(
                sa.text(
                    "INSERT INTO schema_migrations (version, name, checksum, applied_at)"
                    " VALUES (:v, :n, :c, :at)"
                ),
                {"v": mig.version, "n": mig.name, "c": mig.checksum, "at": utcnow()},
            )
            ran_now.append(mig.version)
    return ran_now


def schema_versions(conn: Connection) -> list[int]:
    """The migrations recorded as run, in order."""
    rows = conn.execute(sa.text("SELECT version FROM schema_migrations ORDER BY version"))
    return [int(v) for v in rows.scalars()]
