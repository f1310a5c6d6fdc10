"""An instance and store made under the tenant x slice grid (16 partitions a tenant, whatever
it held) upgrade to partitions that follow the posts without paying for anything again.

``data/upgrade_from_grid.tar.gz`` was made by the code of commit 1fdde96 (the grid), on the
embedded SQLite instance and store, with ``BACKFILL_SLICE_TARGET_POSTS=10``: an ``import`` of
acme (40 posts: 4 partitions), globex (5) and initech (3), then a ``run`` (48 model calls) and a
``verify --require-complete``. Its Dagster home holds the grid's ``tenants`` partitions and the
materialisations, checks and applies of its keys (``s00|acme``...), which the new partitions
keep.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import dagster as dg
import pytest

from backfill_tests.cli_runs import cli_doc

FIXTURE = Path(__file__).parents[1] / "data" / "upgrade_from_grid.tar.gz"
EXPECTED = ["s00|acme", "s01|acme", "s02|acme", "s03|acme", "s00|globex", "s00|initech"]


def test_the_grid_upgrades_without_paying_or_materialising_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    env = {
        "BACKFILL_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}",
        "DAGSTER_HOME": str(tmp_path / "home"),
        "BACKFILL_FAKE_LATENCY_MS": "0",
        "BACKFILL_SLICE_TARGET_POSTS": "10",
    }
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as inst:
        assert len(inst.get_dynamic_partitions("tenants")) == 3  # the grid's dimension
        before = len(inst.get_run_records())

    doc = cli_doc(["run", "--json"], env, capsys)
    assert doc["exit"] == 0
    assert doc["totals"]["model_calls"] == 0 and doc["runs"] == []  # nothing paid, nothing run
    assert sorted(p["partition"] for p in doc["skipped"]) == sorted(EXPECTED)

    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as inst:
        # Registered exactly where posts are; the grid's materialisations count for them.
        assert inst.get_dynamic_partitions("tenant_slices") == EXPECTED
        labels = inst.get_materialized_partitions(dg.AssetKey("moderation_labels"))
        applied = inst.get_materialized_partitions(dg.AssetKey("applied_labels"))
        assert set(EXPECTED) <= labels and set(EXPECTED) <= applied
        assert len(inst.get_run_records()) == before

    # A forced run goes through Dagster again for every partition, and still pays nothing.
    forced = cli_doc(["run", "--json", "--force"], env, capsys)
    assert forced["exit"] == 0 and forced["totals"]["model_calls"] == 0
    assert sorted(p["partition"] for p in forced["partitions"]) == sorted(EXPECTED)
    verify = cli_doc(["verify", "--require-complete", "--json"], env, capsys)
    assert verify["exit"] == 0 and verify["ok"]
