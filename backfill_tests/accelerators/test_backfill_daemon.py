"""``backfill_daemon.interval_seconds``: the instance class shortens the backfill daemon's look
interval (Dagster's constant 30 s) when the daemon opens the instance."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import dagster as dg
import pytest
import yaml

from backfill_assets.accelerators import instance_class
from backfill_assets.accelerators.dagster_private import daemon_controller
from backfill_tests.cli_runs import ROOT
from bench.common import stock_yaml

SHIPPED = [ROOT / "dagster.yaml", ROOT / "deploy" / "dagster.postgres.yaml"]


def _home(tmp_path: Path, extra: str) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text() + extra)
    return home


@pytest.fixture
def controller(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Dagster's daemon controller, its constant restored after the test."""
    monkeypatch.setattr(daemon_controller, "DEFAULT_DAEMON_INTERVAL_SECONDS", 30)
    return daemon_controller


def test_opening_the_instance_sets_the_backfill_daemons_interval(
    tmp_path: Path, controller: ModuleType
) -> None:
    home = _home(tmp_path, "backfill_daemon:\n  interval_seconds: 3\n")
    with dg.DagsterInstance.from_config(str(home)):
        assert controller.DEFAULT_DAEMON_INTERVAL_SECONDS == 3


def test_without_the_setting_dagsters_interval_stays(
    tmp_path: Path, controller: ModuleType
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    doc = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    doc.pop("backfill_daemon")
    (home / "dagster.yaml").write_text(yaml.safe_dump(doc))
    with dg.DagsterInstance.from_config(str(home)):
        assert controller.DEFAULT_DAEMON_INTERVAL_SECONDS == 30


def test_on_another_release_the_setting_is_ignored(
    tmp_path: Path, controller: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(instance_class, "accelerated", lambda postgres=False: False)
    assert instance_class.set_backfill_daemon_interval(3) is False
    assert controller.DEFAULT_DAEMON_INTERVAL_SECONDS == 30


def test_an_interval_below_one_second_is_refused(controller: ModuleType) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        instance_class.set_backfill_daemon_interval(0)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_the_shipped_instances_look_every_few_seconds(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert doc["backfill_daemon"]["interval_seconds"] <= 5
    assert doc["instance_class"]["module"].startswith("backfill_assets.accelerators.")
    queue = doc.get("run_queue") or doc["run_coordinator"]["config"]
    assert queue["dequeue_interval_seconds"] <= 2


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_without_the_accelerators_dagster_loads_the_file(path: Path, tmp_path: Path) -> None:
    """A stock deployment drops the instance class and its setting (Dagster refuses the key)."""
    doc = yaml.safe_load(stock_yaml(path.read_text()))
    assert "instance_class" not in doc and "backfill_daemon" not in doc
    home = tmp_path / "home"
    home.mkdir()
    doc.pop("storage", None)  # no PostgreSQL needed: the file's other sections are what count
    (home / "dagster.yaml").write_text(yaml.safe_dump(doc))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert type(instance) is dg.DagsterInstance
