"""Engines for the two supported stores: SQLite (embedded default) and PostgreSQL."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from backfill_assets.config.urls import normalize_url
from backfill_assets.ledger.dead_peer import DeadPeer
from backfill_assets.ledger.private_files import tighten

# The engine's dead-peer figure, for processes that build their own engine from its URL.
_DEAD_PEER_OPTION = "backfill_dead_peer_s"


def make_engine(url: str, dead_peer: DeadPeer | None = None) -> Engine:
    """Create an engine; SQLite gets WAL, a busy timeout and explicit write locking, and
    PostgreSQL gives up on a silent peer within ``dead_peer`` seconds on both ends."""
    url = normalize_url(url)
    if url.startswith("sqlite"):
        db = sa.engine.make_url(url).database
        if db and db != ":memory:" and not db.startswith("file:"):
            Path(db).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            for path in (Path(db), Path(db + "-wal"), Path(db + "-shm")):
                tighten(path)  # a store created before files were private
        engine = sa.create_engine(url, connect_args={"timeout": 60, "check_same_thread": False})
        _configure_sqlite(engine)
        return engine
    peer = dead_peer or DeadPeer()
    query = dict(sa.engine.make_url(url).query)
    connect_args: dict[str, Any] = dict(peer.missing_client_params(query))
    if "application_name" not in query:
        # Who holds a writer lock, in pg_stat_activity and in a takeover's message.
        connect_args["application_name"] = f"backfill-moderation {socket.gethostname()}"[:63]
    driver: dict[str, Any] = {}
    if sa.engine.make_url(url).get_driver_name() == "psycopg2":
        # An executemany of UPDATEs or DELETEs goes 100 statements a round trip, not one: a
        # fifth of the time at 1,000 rows here. Those a run sends per partition (tenant totals,
        # partition marks) are one statement over arrays instead (writer.py,
        # partition_marks.py). No executemany of ours reads its rowcount, which this mode
        # leaves unset.
        driver["executemany_mode"] = "values_plus_batch"
    engine = sa.create_engine(
        url,
        pool_pre_ping=True,
        pool_size=4,
        max_overflow=8,
        connect_args=connect_args,
        execution_options={_DEAD_PEER_OPTION: peer.seconds},
        **driver,
    )
    _configure_pg_session(engine, peer, str(query.get("options", "")))
    return engine


def engine_dead_peer(engine: Engine) -> DeadPeer:
    """The dead-peer settings ``engine`` was made with (the default for a foreign engine)."""
    seconds = engine.get_execution_options().get(_DEAD_PEER_OPTION)
    return DeadPeer(float(seconds)) if seconds is not None else DeadPeer()


def _configure_pg_session(engine: Engine, peer: DeadPeer, url_options: str) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Server-side keepalives for this session: the server ends a vanished client's
        # session (releasing its advisory locks) within the dead-peer time. A setting the
        # URL's own ``options`` names is the operator's.
        version = getattr(dbapi_conn, "server_version", None)
        settings = {
            k: v for k, v in peer.server_settings(version).items() if f"{k}=" not in url_options
        }
        statements = [f"SET {k} = {int(v)}" for k, v in settings.items()]
        if "random_page_cost=" not in url_options:
            statements.append(_CACHED_PAGES)
        if not statements:
            return
        cur = dbapi_conn.cursor()
        cur.execute("; ".join(statements))
        cur.close()
        dbapi_conn.commit()


# A run's queries over a group of partitions (IN lists of up to 500 tenants) should find their
# rows through the tenant indexes. At the built-in random_page_cost (4, priced for spinning
# disks) PostgreSQL scanned whole tables instead while the store was small enough to be
# cached, in parallel workers: 24 ms a group's count of posts with results, in three
# processes, against 8 ms through the indexes in one; 14 million rows read by scans in a run
# of 10,000 small tenants (50,000 posts), 4.5 million at 1.1. 1.1 is the usual value for
# cached or SSD storage; a value the operator set (server, database, role, or the URL's
# ``options``) is kept.
_CACHED_PAGES = (
    "SELECT set_config('random_page_cost', '1.1', false) FROM pg_settings"
    " WHERE name = 'random_page_cost' AND source = 'default'"
)


def _configure_sqlite(engine: Engine) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control from pysqlite so BEGIN IMMEDIATE is possible.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if engine.url.database not in (None, "", ":memory:"):
            cur.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL: a commit survives a SIGKILL of this process (only power loss can
        # drop the last commits), which is the failure this tool is built for.
        cur.execute("PRAGMA synchronous=NORMAL")
        # Fewer, larger checkpoints and a bigger page cache: the writer appends a lot.
        cur.execute("PRAGMA wal_autocheckpoint=10000")
        cur.execute("PRAGMA cache_size=-65536")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=60000")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Writers take the lock up front; a deferred transaction that upgrades later can
        # fail with SQLITE_BUSY without waiting.
        mode = "IMMEDIATE" if conn.get_execution_options().get("write") else "DEFERRED"
        conn.exec_driver_sql(f"BEGIN {mode}")


def is_sqlite(engine: Engine) -> bool:
    """True for the embedded store."""
    return engine.dialect.name == "sqlite"


@contextlib.contextmanager
def write_tx(engine: Engine) -> Iterator[Connection]:
    """A write transaction (BEGIN IMMEDIATE on SQLite)."""
    with engine.connect().execution_options(write=True) as conn, conn.begin():
        yield conn


@contextlib.contextmanager
def read_tx(engine: Engine) -> Iterator[Connection]:
    """A read transaction with one consistent snapshot where the store offers one."""
    with engine.connect() as conn, conn.begin():
        yield conn


@contextlib.contextmanager
def whole_table_read_tx(engine: Engine) -> Iterator[Connection]:
    """``read_tx`` for reads of whole tables (``verify``), priced at the server's
    ``random_page_cost``, not the store sessions' 1.1 (``_CACHED_PAGES``): at 1.1 PostgreSQL
    read a million posts' tables through their indexes, and ``verify`` took 24.7-25.9 s
    against 23.5-23.9 s at 4. A value the operator set is what ``DEFAULT`` restores."""
    with read_tx(engine) as conn:
        if not is_sqlite(engine):
            conn.exec_driver_sql("SET LOCAL random_page_cost TO DEFAULT")
        yield conn


def refresh_planner_stats(engine: Engine, tables: tuple[str, ...], force: bool = False) -> None:
    """ANALYZE: right after a bulk import or run the planners have no statistics and pick
    scans that cost milliseconds per partition instead of microseconds.

    ``force``: whatever the row counts say, as after an import that added tenants. Statistics
    taken before a tenant came make PostgreSQL expect one row of it and choose nested loops:
    at 10,000,000 posts, with autovacuum off, the run's apply of a later tenant's partition
    took minutes (a loop over the partition's posts for each of its results)."""
    with engine.connect() as conn:
        if is_sqlite(engine):
            # Sampled, so it stays cheap on big files; without statistics SQLite scans a
            # tenant's whole primary key instead of the partition index.
            conn.exec_driver_sql("PRAGMA analysis_limit=1000")
            for table in tables:
                conn.exec_driver_sql(f"ANALYZE {table}")
        else:
            stale = list(tables) if force else _stale_pg_tables(conn, tables)
            if stale:
                conn.exec_driver_sql("ANALYZE " + ", ".join(stale))
        conn.commit()


def _stale_pg_tables(conn: Connection, tables: tuple[str, ...]) -> list[str]:
    # ANALYZE samples 30,000 rows a table: worth it when the planner's row count is off by
    # more than half (a never-analysed table it guesses at a few dozen rows, and scans), not
    # for every 10% of rows updated in place: a run's label updates of `posts` and the steady
    # growth of `results` re-analysed them every group, ~5% of the database's time in a run of
    # 10,000 small tenants. Drift within 2x is left to autovacuum.
    rows = conn.execute(
        sa.text(
            "SELECT s.relname, s.n_live_tup, c.reltuples,"
            " coalesce(s.last_analyze, s.last_autoanalyze) IS NULL AS never"
            " FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"
            " WHERE s.relname = ANY(:names)"
        ),
        {"names": list(tables)},
    ).all()
    seen = {r.relname for r in rows}
    stale = [t for t in tables if t not in seen]
    for r in rows:
        if r.never or _drifted(int(r.n_live_tup), float(r.reltuples)):
            stale.append(str(r.relname))
    return stale


def _drifted(live: int, planned: float) -> bool:
    """The planner's row count (``reltuples``, -1 before any ANALYZE) is off by over 2x,
    beyond the first thousand rows."""
    if planned < 0:
        return True
    return live > max(1000.0, 2 * planned) or (planned > 1000 and live < planned / 2)
