"""The production instance's event log (``pg_event_log.py``) against Dagster's own PostgreSQL
event log: the same rows, far fewer connections, nothing held is lost."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import dagster as dg
import pytest
import sqlalchemy as sa
from dagster._core.definitions.data_version import DATA_VERSION_TAG
from dagster._core.events import DagsterEventType, StepMaterializationData
from dagster._core.events.log import EventLogEntry
from dagster_postgres import PostgresEventLogStorage

from backfill_assets.accelerators import check_executions
from backfill_assets.accelerators.pg_event_log import BatchingPostgresEventLogStorage
from backfill_tests.accelerators.event_entries import (
    ASSET_ROW,
    LABELS,
    check_event,
    check_rows,
    check_run,
    dagster_entry,
    dagster_rows,
    entry,
    run_log,
    store_beside_stock,
)
from backfill_tests.conftest import pg_database

pytestmark = pytest.mark.pg


@pytest.fixture
def two_instances(pg_available: bool) -> Iterator[tuple[str, str]]:
    """Two empty instance databases: Dagster's storage in one, ours in the other."""
    if not pg_available:
        pytest.skip("PostgreSQL not available (set BACKFILL_TEST_PG_URL)")
    with pg_database("bf_dagster") as stock, pg_database("bf_dagster") as ours:
        yield stock, ours


@contextlib.contextmanager
def _connections() -> Iterator[list[str]]:
    """Each new DBAPI connection any engine opens while the block runs."""
    opened: list[str] = []

    def count(_dbapi: object, _record: object) -> None:
        opened.append("connect")

    sa.event.listen(sa.pool.Pool, "connect", count)
    try:
        yield opened
    finally:
        sa.event.remove(sa.pool.Pool, "connect", count)


def test_check_rows_are_what_dagsters_own_storage_writes_on_two_connections_a_batch(
    two_instances: tuple[str, str],
) -> None:
    run = check_run(20)
    evaluations = run[2]
    stock = PostgresEventLogStorage(two_instances[0])
    ours = BatchingPostgresEventLogStorage(two_instances[1])
    with _connections() as opened:
        both = store_beside_stock(stock, ours, run, opened)
    assert {r[4] for r in both.rows} == {"SUCCEEDED", "FAILED"} and len(both.rows) == 20
    # Dagster opens three connections an evaluation (its event row, a schema check, its
    # planned row); ours holds them, then writes them on two and the next event on its own.
    assert both.held == {"stock": 3 * len(evaluations), "ours": 0}
    assert both.spent == {"stock": 3 * len(evaluations) + 1, "ours": 3}
    info = ours.get_asset_check_partition_info([dg.AssetCheckKey(LABELS, "integrity")])
    assert {i.partition_key for i in info} == {f"s00|t{i:03d}" for i in range(20)}
    stock.dispose()
    ours.dispose()


def test_an_evaluation_without_a_planned_row_is_inserted_as_dagster_does(
    two_instances: tuple[str, str],
) -> None:
    # No planned event (Dagster: a step launcher's run): the batched update misses, Dagster's
    # own path inserts the rows; an unpartitioned evaluation goes Dagster's way from the start.
    run_id, _planned, evaluations = check_run(3)
    unpartitioned = dg.AssetCheckEvaluation(asset_key=LABELS, check_name="integrity", passed=True)
    events = [*evaluations, check_event(run_id, unpartitioned)]
    stock = PostgresEventLogStorage(two_instances[0])
    ours = BatchingPostgresEventLogStorage(two_instances[1])
    for storage in (stock, ours):
        for event in events:
            storage.store_event(event)
        storage.store_event(entry(run_id, "the step's next event"))
    rows = check_rows(ours)
    assert rows == check_rows(stock) and len(rows) == 4
    stock.dispose()
    ours.dispose()


def test_held_evaluations_are_written_at_the_cap_at_dispose_and_outside_a_step_at_once(
    two_instances: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(check_executions, "HELD_MAX", 5)
    _run_id, planned, evaluations = check_run(12)
    ours = BatchingPostgresEventLogStorage(two_instances[1])
    reader = PostgresEventLogStorage(two_instances[1])
    ours.store_event(planned)
    for event in evaluations:
        ours.store_event(event)
    assert [r[4] for r in check_rows(reader)].count("PLANNED") == 2  # 2 rounds of 5 written
    ours.dispose()
    assert "PLANNED" not in [r[4] for r in check_rows(reader)]
    # Reported outside a step (the UI, a sensor): no next event of its step is coming.
    run_id, _planned, (first, *_rest) = check_run(1)
    data = first.get_dagster_event().event_specific_data
    ours = BatchingPostgresEventLogStorage(two_instances[1])
    ours.store_event(check_event(run_id, data, step_key=None))
    assert sum(r[3] == run_id for r in check_rows(reader)) == 1  # before any other event
    ours.dispose()
    reader.dispose()


def test_a_failed_batch_stores_the_evaluations_one_at_a_time(
    two_instances: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, planned, evaluations = check_run(4)
    ours = BatchingPostgresEventLogStorage(two_instances[1])
    ours.store_event(planned)

    def broken(_events: object) -> None:
        raise sa.exc.OperationalError("INSERT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(ours, "_insert_rows", broken)
    for event in evaluations:
        ours.store_event(event)
    ours.store_event(entry(run_id, "the step's next event"))
    assert sorted(r[4] for r in check_rows(ours)) == ["FAILED", "FAILED", "SUCCEEDED", "SUCCEEDED"]
    assert run_log(ours, run_id).count(dg.DagsterEventType.ASSET_CHECK_EVALUATION) == 4
    ours.dispose()


def _table(storage: PostgresEventLogStorage, query: str) -> list[tuple[object, ...]]:
    with storage.index_connection() as conn:
        return dagster_rows(conn.exec_driver_sql(query))


def test_a_batch_of_materialisations_is_stored_as_dagster_stores_it(
    two_instances: tuple[str, str],
) -> None:
    # Ours inserts the rows through the driver (one statement); every table ends as Dagster's
    # own batch leaves it: the event rows and their ids, the indexed tags, the asset's row.
    run_id = check_run(1)[0]

    def materialisation(partition: str) -> EventLogEntry:
        data = StepMaterializationData(
            dg.AssetMaterialization(
                asset_key=LABELS, partition=partition, tags={DATA_VERSION_TAG: partition, "k": "v"}
            )
        )
        return dagster_entry(run_id, DagsterEventType.ASSET_MATERIALIZATION, data, "labels")

    batch = [materialisation(f"s00|t{i:03d}") for i in range(5)]
    stock = PostgresEventLogStorage(two_instances[0])
    ours = BatchingPostgresEventLogStorage(two_instances[1])
    for storage in (stock, ours):
        storage.store_event_batch(batch)
    for query in (
        "SELECT * FROM event_logs ORDER BY id",
        "SELECT * FROM asset_event_tags ORDER BY id",
        f"SELECT {ASSET_ROW} FROM asset_keys ORDER BY asset_key",
    ):
        assert _table(ours, query) == _table(stock, query)
    assert len(_table(ours, "SELECT * FROM asset_event_tags")) == 5
    stock.dispose()
    ours.dispose()


def _compression(storage: PostgresEventLogStorage) -> set[str | None]:
    with storage.index_connection() as conn:
        query = "SELECT DISTINCT pg_column_compression(event) FROM event_logs"
        return {row[0] for row in conn.exec_driver_sql(query)}


@pytest.mark.parametrize("pooled", [False, True])
def test_event_bodies_are_compressed_with_lz4_unless_the_operator_chose_otherwise(
    two_instances: tuple[str, str], pooled: bool
) -> None:
    chosen, default = two_instances
    # An operator's own setting (here the database's) is kept; the server's default is not.
    admin = sa.create_engine(chosen, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        name = conn.exec_driver_sql("SELECT current_database()").scalar_one()
        conn.exec_driver_sql(f'ALTER DATABASE "{name}" SET default_toast_compression = pglz')
        offered = conn.exec_driver_sql(
            "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
        ).scalar_one()
    admin.dispose()
    run_id = check_run(1)[0]
    long_text = "moderation " * 1_000  # past the 2 kB at which PostgreSQL compresses a value
    data = StepMaterializationData(
        dg.AssetMaterialization(asset_key=LABELS, partition="p", metadata={"text": long_text})
    )
    batch = [dagster_entry(run_id, DagsterEventType.ASSET_MATERIALIZATION, data, "labels")] * 2
    for url, expected in ((default, "lz4" if offered else "pglz"), (chosen, "pglz")):
        storage = BatchingPostgresEventLogStorage(url)
        if pooled:  # the CLI's and the webserver's: Dagster replaces the engine
            storage.optimize_for_webserver(statement_timeout=0, pool_recycle=3600, max_overflow=8)
        storage.store_event_batch(batch)
        assert _compression(storage) == {expected}
        assert (
            storage.get_event_records(
                dg.EventRecordsFilter(DagsterEventType.ASSET_MATERIALIZATION, asset_key=LABELS)
            )[0]
            .asset_materialization.metadata["text"]
            .value
            == long_text
        )  # type: ignore[union-attr]
        storage.dispose()


def test_a_server_that_cannot_be_asked_is_left_to_dagster() -> None:
    # As Dagster's own storage without table creation: made without a connection, no error.
    down = "postgresql+psycopg2://nobody@127.0.0.1:1/nothing"
    storage = BatchingPostgresEventLogStorage(down, should_autocreate_tables=False)
    assert storage._lz4 is False
    storage.dispose()
