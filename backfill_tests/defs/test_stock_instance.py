"""The instance the tests run on is the one they claim: Dagster's own classes throughout under
the stock-storage pass (``BACKFILL_TEST_DAGSTER=stock``, ``stock_dagster.py``), the
accelerators otherwise; the product reads both through ``defs/instance_api.py``."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from backfill_assets.config.settings import Settings
from backfill_assets.defs.instance_api import is_ours
from backfill_assets.runner.instance import instance
from backfill_tests.cli_runs import clean_env, last_json, run_cli
from backfill_tests.stock_dagster import STOCK


def _assert_kind(inst: dg.DagsterInstance) -> None:
    events, runs = inst.event_log_storage, inst.run_storage
    if STOCK:
        assert type(inst) is dg.DagsterInstance
        assert type(events).__module__.startswith("dagster.")
        assert type(runs).__module__.startswith("dagster.")
        assert type(inst.compute_log_manager).__module__.startswith("dagster.")
        assert not is_ours(inst)
    else:
        assert type(inst).__name__ == "EmbeddedInstance"
        assert type(events).__name__ == "PooledSqliteEventLogStorage"
        assert is_ours(inst)


def test_the_cli_home_is_stock_under_the_stock_pass(tmp_path: Path) -> None:
    inst = instance(Settings.from_env({"DAGSTER_HOME": str(tmp_path / "home")}))
    try:
        _assert_kind(inst)
    finally:
        inst.dispose()


def test_a_run_in_a_child_process_uses_the_same_kind_of_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = clean_env(
        DAGSTER_HOME=str(home), BACKFILL_DATABASE_URL=f"sqlite:///{tmp_path / 'store.db'}"
    )
    export = tmp_path / "posts.jsonl"
    export.write_text(
        "".join(f'{{"tenant_id": "acme", "post_id": "p{i}", "text": "t{i}"}}\n' for i in range(8))
    )
    done = run_cli(["import", str(export), "--json"], env)
    assert done.returncode == 0, done.stderr[-2000:]
    done = run_cli(["run", "--tenant", "acme", "--json"], env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert last_json(done.stdout)["runs"]
    with dg.DagsterInstance.from_config(str(home)) as inst:
        _assert_kind(inst)
        assert inst.get_latest_materialization_event(dg.AssetKey("moderation_labels"))
