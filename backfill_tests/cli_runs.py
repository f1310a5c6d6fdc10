"""Running the CLI from tests, the one way: a clean environment, in this process or as a child,
and the ``--json`` document read from the last line of standard output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from backfill_assets.cli import build_parser
from backfill_assets.orchestration.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def clean_env(**values: str) -> dict[str, str]:
    """This process's environment without any ``BACKFILL_*`` or ``DAGSTER_*`` setting (none of
    the caller's leaks into the command), plus ``values``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BACKFILL_", "DAGSTER_"))}
    env.update(values)
    return env


def last_json(stdout: str) -> Any:
    """The ``--json`` document: the last line of standard output (progress lines come before)."""
    return json.loads(stdout.strip().splitlines()[-1])


def run_cli(
    argv: list[str], env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``backfill-moderation ARGV`` as a child process of the checkout, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "backfill_assets.cli", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cli_doc(argv: list[str], env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> Any:
    """``backfill-moderation ARGV --json`` in this process with the settings of ``env``; its
    document, with the exit code under ``"exit"``."""
    args = build_parser().parse_args([*argv, "--json"] if "--json" not in argv else argv)
    code = args.func(args, Settings.from_env(env))
    doc = last_json(capsys.readouterr().out)
    doc["exit"] = code
    return doc
