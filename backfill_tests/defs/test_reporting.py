"""The graph a user sees makes sense: imports materialise ``posts``, runs refresh
``tenant_usage``, and ``backfill_plan`` shows the cost of the pending work before a launch."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import dagster as dg
import pytest

from backfill_assets.config.settings import Settings
from backfill_assets.definitions import build_definitions
from backfill_tests.cli_runs import cli_doc
from backfill_tests.conftest import write_jsonl


def _latest(instance: dg.DagsterInstance, key: str) -> dict:
    record = instance.fetch_materializations(dg.AssetKey(key), limit=1).records[0]
    mat = record.event_log_entry.asset_materialization
    assert mat is not None
    return dict(mat.metadata)


def test_import_run_and_plan_keep_the_reporting_assets_current(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {
        "BACKFILL_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}",
        "DAGSTER_HOME": str(tmp_path / "home"),
        "BACKFILL_MODEL": "gpt-4o-mini",  # priced, so costs are not 0
    }
    posts = [
        {"tenant_id": t, "post_id": f"p{i}", "text": f"{t} {i}"}
        for t in ("a", "b")
        for i in range(25)
    ]
    export = write_jsonl(tmp_path / "posts.jsonl", posts)
    assert cli_doc(["import", str(export)], env, capsys)["exit"] == 0
    defs = build_definitions(env)
    instance = dg.DagsterInstance.from_config(env["DAGSTER_HOME"])
    with instance:
        imported = _latest(instance, "posts")
        assert imported["imported"] == dg.MetadataValue.int(50)

        plan_job = dg.define_asset_job("plan", selection=["backfill_plan"])
        job = dg.Definitions(
            assets=list(defs.assets or []), jobs=[plan_job], resources=defs.resources
        ).resolve_job_def("plan")
        assert job.execute_in_process(instance=instance).success
        before = _latest(instance, "backfill_plan")
        assert before["pending_keys"] == dg.MetadataValue.int(50)
        assert isinstance(before["estimated_cost_usd"], dg.TextMetadataValue)
        assert Decimal(before["estimated_cost_usd"].value) > 0  # exact decimal text
        assert before["reserved_bound_tokens"].value > 2 * before["estimated_tokens"].value
        assert "| a | 25 |" in before["plan"].value

        assert cli_doc(["run"], env, capsys)["exit"] == 0
        usage = _latest(instance, "tenant_usage")
        assert usage["calls"] == dg.MetadataValue.int(50) and usage["tenants"].value == 2
        assert isinstance(usage["tokens"], dg.IntMetadataValue) and usage["tokens"].value > 0

        assert job.execute_in_process(instance=instance).success
        assert _latest(instance, "backfill_plan")["pending_keys"] == dg.MetadataValue.int(0)


def test_the_reporting_assets_materialise_on_an_empty_store(tmp_path: Path) -> None:
    # The daemon's first tick can come before any import (bin/prod): nothing to report is a
    # report of zeros, typed as the plots expect, not a failed run.
    env = {
        "BACKFILL_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}",
        "DAGSTER_HOME": str(tmp_path / "home"),
    }
    defs = build_definitions(Settings.from_env(env))
    reporting = [defs.resolve_assets_def(k) for k in ("backfill_plan", "tenant_usage")]
    with dg.instance_for_test() as instance:
        result = dg.materialize(reporting, instance=instance)  # resources bound by defs
        assert result.success
        assert _latest(instance, "tenant_usage")["cost_usd"] == dg.MetadataValue.text("0.000000000")
        plan = _latest(instance, "backfill_plan")
        assert plan["reserved_bound_cost_usd"] == dg.MetadataValue.text("0.000000000")
