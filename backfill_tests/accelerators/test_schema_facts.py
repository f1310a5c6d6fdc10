"""Dagster's questions about its own schema are asked of the database once a storage
(``schema_facts.py``), on both instance storages; a no is asked again."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from backfill_assets.accelerators.pg_event_log import (
    AcceleratedPostgresStorage,
    BatchingPostgresEventLogStorage,
    KnownSchemaPostgresRunStorage,
)
from backfill_assets.accelerators.sqlite_event_log import (
    PooledSqliteEventLogStorage,
    PooledSqliteStorage,
)
from backfill_tests.conftest import pg_database

# The catalog queries SQLAlchemy's reflection sends (PostgreSQL, SQLite).
_REFLECTION = re.compile(r"pg_catalog|PRAGMA|sqlite_master|sqlite_schema", re.IGNORECASE)


@contextlib.contextmanager
def _reflections() -> Iterator[list[str]]:
    """The reflection statements any engine sends while the block runs."""
    sent: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if _REFLECTION.search(statement):
            sent.append(statement)

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", seen)
    try:
        yield sent
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", seen)


@pytest.fixture(params=["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
def storage(request: pytest.FixtureRequest, tmp_path: Path, pg_available: bool) -> Iterator[Any]:
    """The instance storage each ``dagster.yaml`` of the project names."""
    if request.param == "sqlite":
        sqlite = PooledSqliteStorage(str(tmp_path))
        assert isinstance(sqlite.event_log_storage, PooledSqliteEventLogStorage)
        yield sqlite
        sqlite.event_log_storage.dispose()
        return
    if not pg_available:
        pytest.skip("PostgreSQL not available (set BACKFILL_TEST_PG_URL)")
    with pg_database("bf_schema") as url:
        pg = AcceleratedPostgresStorage(url)
        assert isinstance(pg.event_log_storage, BatchingPostgresEventLogStorage)
        assert isinstance(pg.run_storage, KnownSchemaPostgresRunStorage)
        yield pg
        pg.event_log_storage.dispose()
        pg.run_storage.dispose()


def _questions(storage: Any) -> list[Callable[[], bool]]:
    events, runs = storage.event_log_storage, storage.run_storage
    asked = [
        lambda: events.has_table("asset_event_tags"),
        lambda: events.has_table("dynamic_partitions"),
        lambda: events.has_asset_key_col("cached_status_data"),
        events.has_asset_key_index_cols,
        events.can_read_asset_status_cache,
    ]
    if isinstance(runs, KnownSchemaPostgresRunStorage):
        asked += [
            runs.has_run_stats_index_cols,
            runs.has_backfill_id_column,
            runs.has_bulk_actions_selector_cols,
            runs.has_bulk_action_job_name_column,
            runs.has_backfill_tags_table,
        ]
    return asked


def test_a_yes_is_asked_of_the_database_once(storage: Any) -> None:
    questions = _questions(storage)
    with _reflections() as first:
        assert all(q() for q in questions)
    with _reflections() as again:
        assert all(q() for q in questions)
    assert first, "the first answers come from the database"
    assert again == []


def test_a_no_is_asked_again_until_the_table_is_there(storage: Any) -> None:
    events = storage.event_log_storage
    with _reflections() as sent:
        assert not events.has_table("backfill_schema_probe")
        assert not events.has_table("backfill_schema_probe")
    assert len(sent) >= 2
    # Another process (``dagster instance migrate``) adds it: the next question sees it.
    with events.index_connection() as conn:
        conn.execute(sa.text("CREATE TABLE backfill_schema_probe (id INTEGER)"))
        if conn.in_transaction():
            conn.commit()
    assert events.has_table("backfill_schema_probe")
    with _reflections() as after:
        assert events.has_table("backfill_schema_probe")
    assert after == []
