"""On a Dagster release other than the one the accelerators were written for, the classes a
``dagster.yaml`` names build Dagster's own storage, with one warning a process."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from backfill_assets.accelerators import version
from backfill_assets.accelerators.pg_instance import BatchingPostgresStorage
from backfill_assets.defs.instance_api import is_ours
from backfill_tests.cli_runs import ROOT
from backfill_tests.conftest import pg_database

WARNING = "using Dagster's own storage"


@pytest.fixture
def other_release(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As if the installed Dagster were another release: the next warning is the first."""
    monkeypatch.setattr(version, "WRITTEN_FOR", "1.13.0")
    monkeypatch.setattr(version, "WRITTEN_FOR_POSTGRES", "0.29.0")
    monkeypatch.setattr(version, "_warned", False)
    yield


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text())
    return home


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]


def test_the_written_for_release_is_the_pinned_one() -> None:
    pinned = {
        line.split("==")[0]: line.split("==")[1].strip()
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line
    }
    assert pinned["dagster"] == version.WRITTEN_FOR
    assert pinned["dagster-postgres"] == version.WRITTEN_FOR_POSTGRES


def test_the_embedded_instance_falls_back_to_dagsters_storage_with_one_warning(
    tmp_path: Path, other_release: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    home = _home(tmp_path)
    for _ in range(2):  # opened twice, warned once
        with dg.DagsterInstance.from_config(str(home)) as inst:
            assert type(inst.event_log_storage).__name__ == "SqliteEventLogStorage"
            assert type(inst.event_log_storage).__module__.startswith("dagster.")
            assert type(inst.run_storage).__module__.startswith("dagster.")
            assert type(inst.compute_log_manager).__name__ == "LocalComputeLogManager"
            assert not is_ours(inst)
            assert dg.materialize([_one], instance=inst).success
    (message,) = _warnings(caplog)
    assert f"dagster {dg.__version__} (written for 1.13.0)" in message


def test_on_the_written_for_release_the_instance_is_accelerated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    with dg.DagsterInstance.from_config(str(_home(tmp_path))) as inst:
        assert type(inst.event_log_storage).__name__ == "PooledSqliteEventLogStorage"
        assert type(inst.compute_log_manager).__name__ == "MirroredComputeLogManager"
        assert is_ours(inst)
    assert _warnings(caplog) == []


@pytest.mark.pg
def test_the_postgres_storage_falls_back_to_dagsters_with_one_warning(
    pg_available: bool, other_release: None, caplog: pytest.LogCaptureFixture
) -> None:
    if not pg_available:
        pytest.skip("PostgreSQL not available (set BACKFILL_TEST_PG_URL)")
    caplog.set_level(logging.WARNING)
    with pg_database("bf_version") as url:
        for _ in range(2):
            storage = BatchingPostgresStorage.from_config_value(None, {"postgres_url": url})
            assert type(storage).__name__ == "DagsterPostgresStorage"
            assert type(storage.event_log_storage).__name__ == "PostgresEventLogStorage"
            storage.event_log_storage.dispose()
            storage.run_storage.dispose()
    assert len(_warnings(caplog)) == 1


@dg.asset
def _one() -> int:
    return 1


def test_old_homes_module_paths_still_open_the_accelerated_instance(tmp_path: Path) -> None:
    from backfill_assets.accelerators import instance_class, pg_instance, sqlite_instance
    from backfill_assets.orchestration import instance_class as old_instance_class
    from backfill_assets.orchestration import pg_instance as old_pg_instance
    from backfill_assets.orchestration import sqlite_instance as old_sqlite_instance

    assert old_sqlite_instance.EmbeddedInstance is sqlite_instance.EmbeddedInstance
    assert old_instance_class.BackfillInstance is instance_class.BackfillInstance
    assert old_pg_instance.BatchingPostgresStorage is pg_instance.BatchingPostgresStorage
    home = _home(tmp_path)
    text = (home / "dagster.yaml").read_text()
    old = text.replace("backfill_assets.accelerators.", "backfill_assets.orchestration.")
    assert old != text
    (home / "dagster.yaml").write_text(old)
    with dg.DagsterInstance.from_config(str(home)) as inst:
        assert type(inst.event_log_storage).__name__ == "PooledSqliteEventLogStorage"
        assert is_ours(inst)
