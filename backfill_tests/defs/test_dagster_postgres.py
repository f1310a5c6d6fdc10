"""The production shape: Dagster's instance and the store both on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from backfill_assets.definitions import BACKFILL_JOB, build_definitions
from backfill_assets.ledger.engines import engine_for
from backfill_assets.runner.orchestrate import materialize
from backfill_tests.cli_runs import ROOT
from backfill_tests.conftest import import_records, pg_database
from backfill_tests.pipeline_helpers import verify
from backfill_tests.stock_dagster import STOCK, instance_yaml


@pytest.fixture
def pg_store(pg_available: bool) -> Iterator[str]:
    if not pg_available:
        pytest.skip("PostgreSQL not available (set BACKFILL_TEST_PG_URL)")
    with pg_database() as url:
        yield url


@pytest.mark.pg
def test_backfill_on_a_postgres_instance(
    pg_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_url = pg_store
    engine = engine_for(store_url)
    import_records(
        engine,
        tmp_path,
        [{"tenant_id": "acme", "post_id": f"p{i}", "text": f"t{i}"} for i in range(40)],
    )
    home = tmp_path / "home"
    home.mkdir()
    # The shipped production config, unchanged (the stock pass: without the accelerators).
    (home / "dagster.yaml").write_text(instance_yaml(ROOT / "deploy" / "dagster.postgres.yaml"))
    with pg_database("bf_dagster") as instance_url:
        monkeypatch.setenv("DAGSTER_PG_URL", instance_url)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            defs = build_definitions({"BACKFILL_DATABASE_URL": store_url})
            slices = [f"s{i:02d}" for i in range(16)]
            records = materialize(
                defs, instance, BACKFILL_JOB, ["acme"], slices, log_level="WARNING"
            )
            assert [r.success for r in records] == [True]
            if STOCK:
                assert type(instance.run_storage).__name__ == "PostgresRunStorage"
                assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
                assert type(instance) is dg.DagsterInstance
                assert type(instance.compute_log_manager).__name__ == "LocalComputeLogManager"
            else:
                assert type(instance.run_storage).__name__ == "KnownSchemaPostgresRunStorage"
                assert type(instance.event_log_storage).__name__ == (
                    "BatchingPostgresEventLogStorage"
                )
                assert type(instance).__name__ == "BackfillInstance"
                assert type(instance.compute_log_manager).__name__ == "MirroredComputeLogManager"
            done = instance.get_materialized_partitions(dg.AssetKey("moderation_labels"))
            assert len(done) == 16
        assert verify(engine).as_dict(require_complete=True)["ok"]
