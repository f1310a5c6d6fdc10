"""The ``posts`` asset imports from the database the environment names (never run config),
incrementally, and its schedule ships stopped."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from backfill_assets.defs.posts.assets import IMPORT_JOB, INCREMENTAL_SCHEDULE
from backfill_assets.wiring import build_definitions

PASSWORD = "pw-never-shown-5521"


def _source(tmp_path: Path) -> tuple[str, sa.Engine]:
    url = f"sqlite:///{tmp_path / 'platform.db'}"
    app = sa.create_engine(url)
    with app.begin() as conn:
        conn.execute(
            sa.text("CREATE TABLE app_posts (tenant_id TEXT, post_id TEXT, text TEXT, at TEXT)")
        )
        conn.execute(
            sa.text(
                "INSERT INTO app_posts VALUES ('acme', 'p1', 'one', :t), ('acme', 'p2', 'two', :t)"
            ),
            {"t": dt.datetime(2026, 1, 1).isoformat()},
        )
    return url, app


def _env(tmp_path: Path, source_url: str) -> dict[str, str]:
    return {
        "DAGSTER_HOME": str(tmp_path / "home"),
        "BACKFILL_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}",
        "BACKFILL_SOURCE_URL": source_url,
        "BACKFILL_SOURCE_QUERY": "SELECT tenant_id, post_id, text, at FROM app_posts",
        "BACKFILL_SOURCE_CURSOR": "at",
    }


def test_the_asset_imports_the_environment_source_incrementally(tmp_path: Path) -> None:
    url, app = _source(tmp_path)
    defs = build_definitions(_env(tmp_path, url))
    job = defs.resolve_job_def(IMPORT_JOB)
    instance = dg.DagsterInstance.ephemeral()
    first = job.execute_in_process(instance=instance)
    assert first.success
    (mat,) = first.asset_materializations_for_node("posts")
    assert mat.metadata["imported"].value == 2
    assert mat.metadata["source"].value == "sql:posts_asset"
    assert instance.get_dynamic_partitions("tenant_slices") == ["s00|acme"]
    with app.begin() as conn:
        conn.execute(sa.text("INSERT INTO app_posts VALUES ('acme', 'p3', 'three', '2026-02-01')"))
    (again,) = job.execute_in_process(instance=instance).asset_materializations_for_node("posts")
    # The mark's cursor value is read again (its two rows unchanged), then the new row.
    got = tuple(again.metadata[k].value for k in ("read", "imported", "unchanged"))
    assert got == (3, 1, 2)


def test_the_source_is_no_config_a_launch_could_set_or_see(tmp_path: Path) -> None:
    url = f"postgresql://app:{PASSWORD}@db.internal/platform"
    defs = build_definitions(_env(tmp_path, url))
    job = defs.resolve_job_def(IMPORT_JOB)
    snapshot = dg.serialize_value(job.get_job_snapshot())
    # Resources are sealed (no config); the source is not a resource at all, and the asset's
    # own config is the file path only.
    assert PASSWORD not in snapshot and "db.internal" not in snapshot
    posts_config = job.run_config_schema.config_type.fields["ops"].config_type.fields["posts"]
    assert set(posts_config.config_type.fields["config"].config_type.fields) == {"path"}


def test_the_schedule_ships_stopped_and_skips_without_a_source(tmp_path: Path) -> None:
    env = {"DAGSTER_HOME": str(tmp_path / "home")}
    schedule = build_definitions(env).resolve_schedule_def(INCREMENTAL_SCHEDULE)
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    with dg.build_schedule_context() as context:
        assert isinstance(schedule.evaluate_tick(context).skip_message, str)
    url, _ = _source(tmp_path)
    with_source = build_definitions(_env(tmp_path, url)).resolve_schedule_def(INCREMENTAL_SCHEDULE)
    with dg.build_schedule_context() as context:
        (request,) = with_source.evaluate_tick(context).run_requests or []
    assert request.tags["import"] == "sql:posts_asset"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"BACKFILL_SOURCE_URL": "sqlite://"}, "BACKFILL_SOURCE_QUERY is not"),
        ({"BACKFILL_SOURCE_CURSOR": "at"}, "BACKFILL_SOURCE_URL is not"),
        ({"BACKFILL_SOURCE_SCHEDULE": "often"}, "not a cron schedule"),
    ],
)
def test_an_incomplete_source_stops_the_load(env: dict[str, str], message: str) -> None:
    from backfill_assets.config.settings import Settings, SettingsError

    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)
