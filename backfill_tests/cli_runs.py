"""Running the CLI from tests, the one way: a clean environment, in this process or as a child,
and the ``--json`` document read from the last line of standard output."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import build_parser, main
from backfill_assets.config.settings import Settings
from backfill_tests.stock_dagster import seed_home
from bench.common import run_peak

ROOT = Path(__file__).resolve().parents[1]


def clean_env(**values: str) -> dict[str, str]:
    """This process's environment without any ``BACKFILL_*`` or ``DAGSTER_*`` setting (none of
    the caller's leaks into the command), plus ``values``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BACKFILL_", "DAGSTER_"))}
    env.update(values)
    return env


def clear_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drop every ``BACKFILL_*`` and ``DAGSTER_*`` variable from this process's environment
    for the test (for code that reads ``os.environ`` itself: in-process CLI, servers)."""
    for name in [k for k in os.environ if k.startswith(("BACKFILL_", "DAGSTER_"))]:
        monkeypatch.delenv(name)


def last_json(stdout: str) -> Any:
    """The ``--json`` document: the last line of standard output (progress lines come before)."""
    return json.loads(stdout.strip().splitlines()[-1])


def run_cli(
    argv: list[str], env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``backfill-moderation ARGV`` as a child process of the checkout, output captured."""
    seed_home(env.get("DAGSTER_HOME"))
    return subprocess.run(
        [sys.executable, "-m", "backfill_assets.cli", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_cli_peak(
    argv: list[str], env: dict[str, str], timeout: float = 300
) -> tuple[subprocess.CompletedProcess[str], float]:
    """``run_cli`` with the child's own peak RSS in MiB."""
    seed_home(env.get("DAGSTER_HOME"))
    return run_peak([sys.executable, "-m", "backfill_assets.cli", *argv], env, timeout)


def cli_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``backfill-moderation ARGV`` in this process, as the command runs it (its settings from
    this process's environment): the exit code, standard output and standard error."""
    capsys.readouterr()  # what earlier calls printed is theirs
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def cli_with_env(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """``backfill-moderation ARGV`` in this process as ``main`` runs it, with ``env`` as its
    only ``BACKFILL_*``/``DAGSTER_*`` settings for the call: the exit code, standard output
    and standard error (captured here, so property tests can call it without fixtures)."""
    saved, wanted = dict(os.environ), clean_env(**env)
    out, err = io.StringIO(), io.StringIO()
    try:
        os.environ.clear()
        os.environ.update(wanted)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return code, out.getvalue(), err.getvalue()


def cli_here(
    argv: list[str], env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    """``backfill-moderation ARGV`` in this process with the settings of ``env`` (the process's
    environment untouched): the exit code and standard output."""
    args = build_parser().parse_args(argv)
    code: int = args.func(args, Settings.from_env(env))
    return code, capsys.readouterr().out


def cli_doc(argv: list[str], env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> Any:
    """``cli_here`` with ``--json``: the command's document, the exit code under ``"exit"``."""
    code, out = cli_here([*argv, "--json"] if "--json" not in argv else argv, env, capsys)
    doc = last_json(out)
    doc["exit"] = code
    return doc


def unanswered_attempts(engine: Engine) -> int:
    """Attempts with no usage or error booked: the calls a killed run had announced and not
    seen answered (what a crash may re-pay at most)."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM ledger_events a WHERE a.type = 'attempt' AND NOT EXISTS"
                    " (SELECT 1 FROM ledger_events e WHERE e.attempt_id = a.attempt_id"
                    " AND e.type <> 'attempt')"
                )
            ).scalar_one()
        )
