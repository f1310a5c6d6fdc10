"""Only the commands that price or send need ``BACKFILL_MODEL`` to have a price: ``run``,
``dry-run``, ``evaluate``, ``launch`` (and the code location, whose runs send). Every other
command, ``import`` and ``tenant`` among them, works for a model the price table lacks."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from backfill_assets.config.settings import Settings, SettingsError
from backfill_assets.ingest.importer import import_path
from backfill_assets.wiring import build_definitions
from backfill_tests.cli_commands import Command, Files, commands, harmless_argv
from backfill_tests.cli_runs import clear_settings, cli_main

PRICED = {("run",), ("dry-run",), ("evaluate",), ("launch",)}
UNPRICED = {
    "BACKFILL_MODEL_BACKEND": "openai",
    "BACKFILL_MODEL": "my-llama",
    # Nothing answers there: a command that did send would fail, not hang.
    "BACKFILL_MODEL_BASE_URL": "http://127.0.0.1:1/v1",
    "DAGSTER_WEBSERVER_URL": "http://127.0.0.1:1",
}
SAYS = "BACKFILL_MODEL 'my-llama' has no price"


@pytest.fixture
def files(engine: Engine, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Files:
    clear_settings(monkeypatch)
    env = {
        **UNPRICED,
        "BACKFILL_DATABASE_URL": store_url,
        "DAGSTER_HOME": str(tmp_path / "home"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    files = Files.make(tmp_path / "files")
    # The tenant the commands name exists, whatever order they run in.
    import_path(engine, files.root / "posts.jsonl")
    return files


@pytest.mark.parametrize("cmd", commands(), ids=lambda c: c.name)
def test_only_commands_that_price_or_send_ask_for_a_price(
    files: Files, capsys: pytest.CaptureFixture[str], cmd: Command
) -> None:
    code, _, err = cli_main(harmless_argv(cmd, files), capsys)
    assert "Traceback" not in err
    if cmd.path in PRICED:
        assert code == 2 and SAYS in err, err[-2000:]
    else:
        assert "has no price" not in err, err[-2000:]


def test_launch_dry_run_prices_nothing(files: Files, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli_main(["launch", "--stale", "--dry-run"], capsys)
    assert code == 2 and "has no price" not in err and "webserver" in err


def test_the_code_location_still_refuses_an_unpriced_model() -> None:
    settings = Settings.from_env({**UNPRICED, "DAGSTER_HOME": "/nonexistent"}, load_policy=False)
    with pytest.raises(SettingsError, match=SAYS):
        build_definitions(settings)
