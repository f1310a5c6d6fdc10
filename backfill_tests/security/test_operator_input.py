"""Operator mistakes end in one line naming the variable and exit 2, never in a traceback or in
silent dead letters; no URL is ever printed with its password."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from backfill_tests.cli_runs import ROOT, clean_env, run_cli

PASSWORD = "Sup3r-s3cret-pw"


def _cli(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli(["dry-run"], clean_env(DAGSTER_HOME=str(tmp_path / "home"), **env), 120)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            {"BACKFILL_DATABASE_URL": f"postgresql://app:{PASSWORD}@127.0.0.1:1/db"},
            "cannot use the store postgresql://app:***@127.0.0.1:1/db (BACKFILL_DATABASE_URL)",
        ),
        ({"BACKFILL_DATABASE_URL": "not a url"}, "BACKFILL_DATABASE_URL='not a url': is not"),
        (
            {"BACKFILL_DATABASE_URL": f"postgresql://app:{PASSWORD}@h:port/db"},
            "BACKFILL_DATABASE_URL='postgresql://app:***@h:port/db': is not a database URL",
        ),
        ({"BACKFILL_DATABASE_URL": "mysql://h/db"}, "must be SQLite or PostgreSQL"),
        ({"BACKFILL_MODEL_BASE_URL": "ftp://h/v1"}, "BACKFILL_MODEL_BASE_URL='ftp://h/v1': must"),
        ({"BACKFILL_MODEL_BASE_URL": "api.openai.com"}, "must be an http:// or https:// URL"),
        (
            {"BACKFILL_MODEL_BASE_URL": f"https://u:{PASSWORD}@h/v1"},
            "must not carry a user name or password",
        ),
        (
            {"BACKFILL_MODEL_BASE_URL__EU": f"https://:{PASSWORD}@h/v1"},
            "BACKFILL_MODEL_BASE_URL__EU: must not carry a user name or password",
        ),
        ({"BACKFILL_POLICY_PATH": "/no/such/policy.yaml"}, "BACKFILL_POLICY_PATH"),
        (
            {"BACKFILL_MODEL_BACKEND": "openai", "BACKFILL_MODEL": "my-llama"},
            "BACKFILL_MODEL 'my-llama' has no price: add it to BACKFILL_PRICES",
        ),
    ],
)
def test_a_bad_setting_exits_2_with_one_line_naming_it(
    tmp_path: Path, env: dict[str, str], says: str
) -> None:
    done = _cli(tmp_path, **env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert says in done.stderr
    assert "Traceback" not in done.stderr and PASSWORD not in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:p@ss@db:5432/x", "postgresql://app:***@db:5432/x"),
        ("postgresql://:secret@db/x", "postgresql://:***@db/x"),
        (
            "postgresql://db/x?password=secret&sslmode=require",
            "postgresql://db/x?password=***&sslmode=require",
        ),
        ("postgresql://app:pa%40ss@db/x", "postgresql://app:***@db/x"),
        ("sqlite:////var/lib/b.db", "sqlite:////var/lib/b.db"),
    ],
)
def test_the_scripts_print_urls_through_the_one_redactor(url: str, shown: str) -> None:
    # bin/dev and bin/prod call this before (bin/prod) or after their virtualenv exists.
    done = subprocess.run(
        ["python3", str(ROOT / "deploy" / "redact_url.py"), url],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ["PATH"]},
        cwd="/",
        check=True,
    )
    assert done.stdout.strip() == shown
