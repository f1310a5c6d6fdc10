"""Every argument is checked before a command writes where the command line points: a refused
``export --out DIR`` or ``demo-data --out FILE`` leaves no DIR and no FILE behind (the
hostile-input test in security/ holds every command to the same)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from backfill_tests.cli_runs import clear_settings, cli_main
from backfill_tests.conftest import import_records
from backfill_tests.policy_helpers import DOCS_POLICIES

GOLD = DOCS_POLICIES / "course-gold.csv"
POSTS = [{"tenant_id": "acme", "post_id": f"p{i}", "text": f"post {i}"} for i in range(3)]


@pytest.fixture
def store(engine: Engine, tmp_path: Path, cli_store: dict[str, str]) -> Engine:
    import_records(engine, tmp_path, POSTS)
    return engine


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["export", "--out", "OUT", "--tenant", "../x"], "argument --tenant: "),
        (["export", "--out", "OUT", "--tenant", "acme", "--tenant", "nobody"], "'nobody'"),
        (["export", "--out", "OUT", "--tenant", "acmee"], "did you mean acme?"),
        (["export", "--out", "OUT", "--format", "xml"], "argument --format"),
        (["demo-data", "--out", "OUT", "--tenants", "0"], "argument --tenants"),
        (["evaluate", str(GOLD), "--report", "OUT", "--tenant", "../x"], "argument --tenant"),
        (["evaluate", str(GOLD), "--report", "OUT", "--tenant", "acme"], "customer"),
    ],
)
def test_a_refused_command_creates_nothing_it_was_pointed_at(
    store: Engine,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    says: str,
) -> None:
    out = tmp_path / "new" / "dir"
    code, _, err = cli_main([str(out) if a == "OUT" else a for a in argv], capsys)
    assert not (tmp_path / "new").exists()
    assert code == 2 and says in err, err


def test_a_valid_export_still_makes_its_directory(
    store: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new" / "dir"
    code, _, err = cli_main(["export", "--out", str(out), "--tenant", "acme"], capsys)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["acme.parquet", "manifest.json"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["run", "--deadline", "36h", "--sample", "3"], "not with --sample"),
        (["run", "--dry-run"], "go with --deadline"),
        (["check"], "exactly one --tenant"),
        (["usage", "--reconcile", "MISSING"], "--reconcile: cannot read"),
        (["dry-run", "--policy", "MISSING"], "argument --policy"),
        (["launch"], "choose at least one of"),
        (["tenant", "set-region", "acme", "EU!"], "argument REGION"),
        (["tenant", "set-budget", "acme"], "give --usd"),
        (["import", "--map", "nonsense"], "argument --map"),
        (["evaluate", "MISSING"], "argument GOLD"),
    ],
)
def test_arguments_wrong_in_themselves_are_refused_before_the_store_is_opened(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    says: str,
) -> None:
    clear_settings(monkeypatch)
    home = tmp_path / "home"  # the default store lives in it: opening one creates it
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    code, _, err = cli_main([str(tmp_path / "nope") if a == "MISSING" else a for a in argv], capsys)
    assert not home.exists()
    assert code == 2 and says in err, err
