"""What the backfill writes to disk is its owner's only: the store, its lock files, Dagster's
run shards and event logs, compute logs. Files 0600, directories 0700, on a default umask."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from backfill_assets.ledger.engine import make_engine
from backfill_tests.cli_runs import clean_env

DEMO = Path(__file__).resolve().parents[2] / "backfill_assets" / "demo" / "posts.jsonl"


def _loose(root: Path) -> list[str]:
    out = []
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            out.append(f"{path.relative_to(root)} {oct(mode)}")
    return out


def test_a_run_from_the_cli_leaves_nothing_readable_by_others(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = clean_env()
    env["DAGSTER_HOME"] = str(home)
    for argv in (["import", str(DEMO)], ["run", "--tenant", "acme"]):
        done = subprocess.run(
            [sys.executable, "-m", "backfill_assets.cli", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            # The default a shared host gives: group and others may read what is created.
            preexec_fn=lambda: os.umask(0o022),
        )
        assert done.returncode == 0, done.stderr[-2000:]
    assert (home / "backfill.db").exists() and any(home.rglob("*.db"))
    assert _loose(home) == []


def test_a_store_created_before_is_tightened_when_opened(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    db.touch(mode=0o644)
    db.chmod(0o644)
    engine = make_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))
    engine.dispose()
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
