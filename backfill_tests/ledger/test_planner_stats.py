"""When the store refreshes PostgreSQL's planner statistics: a table the planner has never
measured, or whose row count moved past 2x, not one whose rows were updated in place."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.domain.work.keys import Versions
from backfill_assets.ledger.engine import (
    _drifted,
    make_engine,
    read_tx,
    refresh_planner_stats,
    whole_table_read_tx,
)
from backfill_assets.ledger.migrate import migrate
from backfill_assets.runner.verify import verify_store
from backfill_tests.conftest import import_records, pg_database


@pytest.mark.parametrize(
    ("live", "planned", "stale"),
    [
        (0, -1.0, True),  # never analysed
        (900, 0.0, False),  # the first thousand rows are not worth a sample
        (5000, 0.0, True),
        (5000, 2600.0, False),
        (5300, 2600.0, True),
        (1200, 2600.0, True),  # shrunk past half
        (2600, 2600.0, False),
    ],
)
def test_a_table_is_stale_once_its_row_count_is_off_by_2x(
    live: int, planned: float, stale: bool
) -> None:
    assert _drifted(live, planned) is stale


@pytest.fixture
def pg_engine(pg_available: bool) -> Iterator[Engine]:
    if not pg_available:
        pytest.skip("PostgreSQL not available (set BACKFILL_TEST_PG_URL)")
    with pg_database() as url:
        engine = sa.create_engine(url)
        yield engine
        engine.dispose()


def _write(engine: Engine, sql: str) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(sql)
        conn.exec_driver_sql("SELECT pg_stat_force_next_flush()")  # counters at commit


def _analysed(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.exec_driver_sql(
                "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 't'"
            ).scalar_one()
        )


@pytest.mark.pg
def test_updates_in_place_do_not_reanalyse_but_growth_does(pg_engine: Engine) -> None:
    _write(pg_engine, "CREATE TABLE t (id int PRIMARY KEY, label text)")
    _write(pg_engine, "INSERT INTO t SELECT g, 'a' FROM generate_series(1, 3000) g")
    refresh_planner_stats(pg_engine, ("t",))
    assert _analysed(pg_engine) == 1  # never analysed
    _write(pg_engine, "UPDATE t SET label = 'b'")  # every row modified, none added
    refresh_planner_stats(pg_engine, ("t",))
    assert _analysed(pg_engine) == 1
    _write(pg_engine, "INSERT INTO t SELECT g, 'a' FROM generate_series(3001, 5000) g")
    refresh_planner_stats(pg_engine, ("t",))
    assert _analysed(pg_engine) == 1  # 5,000 rows where it planned 3,000: within 2x
    _write(pg_engine, "INSERT INTO t SELECT g, 'a' FROM generate_series(5001, 7000) g")
    refresh_planner_stats(pg_engine, ("t",))
    assert _analysed(pg_engine) == 2


@pytest.mark.pg
def test_forced_refresh_reanalyses_within_2x(pg_engine: Engine) -> None:
    # An import that adds tenants: the row count moved less than 2x, but statistics taken
    # before the new tenants would make the planner expect one row of each.
    _write(pg_engine, "CREATE TABLE t (id int PRIMARY KEY, label text)")
    _write(pg_engine, "INSERT INTO t SELECT g, 'a' FROM generate_series(1, 3000) g")
    refresh_planner_stats(pg_engine, ("t",))
    _write(pg_engine, "INSERT INTO t SELECT g, 'new' FROM generate_series(3001, 3500) g")
    refresh_planner_stats(pg_engine, ("t",))
    assert _analysed(pg_engine) == 1
    refresh_planner_stats(pg_engine, ("t",), force=True)
    assert _analysed(pg_engine) == 2


def _page_cost(url: str) -> str:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return str(conn.exec_driver_sql("SHOW random_page_cost").scalar_one())
    finally:
        engine.dispose()


@pytest.mark.pg
def test_store_sessions_price_pages_as_cached_unless_the_operator_did(
    pg_engine: Engine,
) -> None:
    # 1.1 unless random_page_cost was set for the server, database or role, or in the URL.
    url = pg_engine.url.render_as_string(hide_password=False)
    assert _page_cost(url) == "1.1"
    assert _page_cost(url + "?options=-c%20random_page_cost%3D3") == "3"
    name = pg_engine.url.database
    with pg_engine.connect() as conn:
        conn.exec_driver_sql(f'ALTER DATABASE "{name}" SET random_page_cost = 2')
        conn.commit()
    assert _page_cost(url) == "2"


@pytest.mark.pg
def test_verify_reads_whole_tables_at_the_servers_page_cost(pg_engine: Engine) -> None:
    # verify reads every row: at the sessions' 1.1 PostgreSQL read them through the indexes,
    # slower than scanning. Its transaction prices pages as the server (or operator) does.
    url = pg_engine.url.render_as_string(hide_password=False)
    sent: list[str] = []

    def seen(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        sent.append(statement)

    for options, inside in (("", "4"), ("?options=-c%20random_page_cost%3D3", "3")):
        engine = make_engine(url + options)
        try:
            with whole_table_read_tx(engine) as conn:
                assert conn.exec_driver_sql("SHOW random_page_cost").scalar_one() == inside
            with read_tx(engine) as conn:  # the next transaction on the same session
                after = conn.exec_driver_sql("SHOW random_page_cost").scalar_one()
            assert after == ("1.1" if not options else "3")
            migrate(engine)
            sent.clear()
            sa.event.listen(engine, "before_cursor_execute", seen)
            verify_store(engine, Versions("t", "p", "m"))
            assert sent[0] == "SET LOCAL random_page_cost TO DEFAULT"
        finally:
            engine.dispose()


@pytest.mark.pg
def test_an_import_that_adds_tenants_reanalyses_posts(pg_engine: Engine, tmp_path: Path) -> None:
    migrate(pg_engine)

    def analysed() -> int:
        with pg_engine.connect() as conn:
            conn.exec_driver_sql("SELECT pg_stat_force_next_flush()")
            return int(
                conn.exec_driver_sql(
                    "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'posts'"
                ).scalar_one()
            )

    def posts_of(tenant: str, n: int) -> list[dict[str, str]]:
        return [{"tenant_id": tenant, "post_id": f"p{i}", "text": f"post {i}"} for i in range(n)]

    import_records(pg_engine, tmp_path, posts_of("acme", 3000), name="a.jsonl")
    first = analysed()
    # Within 2x and no new tenant: left as it is.
    import_records(pg_engine, tmp_path, posts_of("acme", 3300), name="b.jsonl")
    assert analysed() == first
    # A new tenant of 300 posts: analysed again.
    import_records(pg_engine, tmp_path, posts_of("globex", 300), name="c.jsonl")
    assert analysed() == first + 1
