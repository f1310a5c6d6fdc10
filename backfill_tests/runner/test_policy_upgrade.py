"""Upgrading re-pays nothing: a store filled by the code before policy files, run with the
built-in policy after it, sends 0 requests (docs/policies.md, "Upgrading").

The store is filled by that code itself: the commit before policy files, taken from git, runs
``backfill-moderation import`` and ``run`` in a subprocess (its own modules first on the path),
as an operator did. Then this code migrates the store, plans (every partition skipped: the
code version is unchanged), runs the pipeline (0 calls), verifies and applies.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from backfill_assets.config.settings import Settings
from backfill_assets.ledger.engines import engine_for
from backfill_assets.runner.plan import make_plan
from backfill_tests.cli_runs import ROOT, clean_env
from backfill_tests.conftest import pg_database, write_jsonl
from backfill_tests.pipeline_helpers import RUBRIC, VERSIONS, calls, count, run, verify

# The last commit before policy files (its store layout, keys and code version are today's).
BEFORE_POLICIES = "1e126cd1af02031c5b1b9be9d5c3cc73eb605a50"

FILL = """
import json, os, sys
import backfill_assets.core.rubric as rubric  # that commit's layout
from backfill_assets.cli import main
assert hasattr(rubric, "LABELS"), "not the code from before policy files"
export, stores = sys.argv[1], json.loads(sys.argv[2])
for url, home in stores:  # one process for every store: the imports are paid once
    os.environ["BACKFILL_DATABASE_URL"], os.environ["DAGSTER_HOME"] = url, home
    code = main(["import", export]) or main(["run", "--json"])
    if code:
        sys.exit(code)
"""
POSTS = [
    {"tenant_id": t, "post_id": f"p{i}", "text": text}
    for t in ("acme", "globex")
    for i, text in enumerate(
        ["BUY NOW limited offer", "You are an idiot", "thanks, it works", "self-harm help?"] * 5
    )
]


def _old_code(tmp_path: Path) -> Path:
    """The package and migrations at ``BEFORE_POLICIES``, from git (skip without git)."""
    out = tmp_path / "before"
    out.mkdir()
    try:
        paths = ["backfill_assets", "sql", "dagster.yaml"]
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", BEFORE_POLICIES, *paths],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"the code before policy files is not in git here: {exc}")
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


@pytest.fixture(scope="module")
def filled(
    tmp_path_factory: pytest.TempPathFactory, pg_available: bool
) -> Iterator[dict[str, tuple[str, Path]]]:
    """SQLite and (when it answers) PostgreSQL stores, each with its Dagster home, filled by
    the code before policy files: ``import`` then ``run``."""
    tmp = tmp_path_factory.mktemp("upgrade")
    old = _old_code(tmp)
    stores = {"sqlite": (f"sqlite:///{tmp / 'store.db'}", tmp / "home-sqlite")}
    with contextlib.ExitStack() as stack:
        if pg_available:
            stores["pg"] = (stack.enter_context(pg_database()), tmp / "home-pg")
        env = clean_env(PYTHONPATH=str(old), BACKFILL_SLICE_TARGET_POSTS="0")
        export = write_jsonl(tmp / "posts.jsonl", POSTS)
        pairs = json.dumps([(url, str(home)) for url, home in stores.values()])
        done = subprocess.run(
            [sys.executable, "-c", FILL, str(export), pairs],
            cwd=old,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith("{")]
        assert [r["totals"]["model_calls"] for r in runs] == [len(POSTS)] * len(stores)
        yield stores


@pytest.mark.parametrize("store", ["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
def test_a_store_filled_before_policy_files_sends_nothing_after(
    filled: dict[str, tuple[str, Path]], store: str
) -> None:
    if store not in filled:
        pytest.skip("PostgreSQL not available (set BACKFILL_TEST_PG_URL)")
    store_url, home = filled[store]
    # This code: the store migrates (rule ids, policy versions, applied labels) on first use.
    engine = engine_for(store_url)
    assert count(engine, "SELECT count(*) FROM results") == len(POSTS)
    applied = "SELECT count(*) FROM applied_labels WHERE policy_id = 'default'"
    assert count(engine, applied) == len(POSTS)
    settings = Settings.from_env({"BACKFILL_DATABASE_URL": store_url, "DAGSTER_HOME": str(home)})
    assert settings.versions() == VERSIONS  # the built-in policy: today's code version
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        plan = make_plan(engine, instance, settings.versions(), None, None)
    finally:
        instance.dispose()
    assert plan.boxes == [], plan  # nothing pending, materialised at this code version
    reports, _ = run(engine, ["acme", "globex"])
    assert calls(reports) == 0
    assert sum(r.skipped for r in reports) == len(POSTS)
    assert verify(engine).as_dict(require_complete=True)["ok"]
    with engine.connect() as conn:
        labels = dict(
            conn.execute(sa.text("SELECT label, count(*) FROM results GROUP BY label")).all()
        )
    assert set(labels) == set(RUBRIC.policy.label_ids)
