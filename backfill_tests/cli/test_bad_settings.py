"""A bad environment variable exits 2 and names the variable, for every command, no traceback.

The console script runs in a subprocess, as an operator runs it: the environment is parsed
once by the entry point, before any command (or the Dagster definitions) is built.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from backfill_assets.config.settings import Settings, SettingsError
from backfill_tests.cli_runs import clean_env

COMMANDS = [
    ["run"],
    ["dry-run"],
    ["verify"],
    ["import", "posts.jsonl"],
    ["launch", "--stale"],
]


def _cli(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = clean_env() | {
        "DAGSTER_HOME": str(tmp_path / "home"),
        "BACKFILL_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}",
    }
    code = "import sys; from backfill_assets.cli import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=base | env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
def test_a_bad_value_exits_2_and_names_the_variable(args: list[str], tmp_path: Path) -> None:
    (tmp_path / "posts.jsonl").write_text("")
    got = _cli(args, tmp_path, BACKFILL_CONCURRENCY="abc")
    assert got.returncode == 2, got.stderr
    assert "BACKFILL_CONCURRENCY='abc' is not an integer" in got.stderr
    assert "Traceback" not in got.stderr


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("BACKFILL_PARTITIONS_PER_RUN", "0"),
        ("BACKFILL_EXECUTOR", "threads"),
        ("BACKFILL_ADAPTIVE", "maybe"),
        ("BACKFILL_DRIFT_LABELS", "spam,nsfw"),
        ("BACKFILL_DRIFT_BASELINE", '{"nsfw": 1}'),
        ("BACKFILL_MODEL_BASE_URL__eu", "http://eu.example/v1"),
        # A lane is the same model at another endpoint: a dialect or model per region is
        # refused by name, never silently ignored.
        ("BACKFILL_MODEL_DIALECT__EU", "llama-guard"),
        ("BACKFILL_MODEL__EU", "gpt-4o-mini"),
        ("BACKFILL_POLICY_PATH", "/no/such/policy.yaml"),
        ("BACKFILL_PROMPT_PATH", "/some/prompt.txt"),
    ],
)
def test_each_bad_variable_is_named(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})


def test_the_prompt_file_is_replaced_by_a_policy_file(tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Classify the post.")
    got = _cli(["dry-run"], tmp_path, BACKFILL_PROMPT_PATH=str(prompt))
    assert got.returncode == 2, got.stderr
    assert "BACKFILL_PROMPT_PATH" in got.stderr and "BACKFILL_POLICY_PATH" in got.stderr
    assert "Traceback" not in got.stderr


def test_drift_labels_are_the_policys(tmp_path: Path) -> None:
    from backfill_tests.policy_helpers import COURSE_V5

    course = {"BACKFILL_POLICY_PATH": str(COURSE_V5)}
    assert Settings.from_env(
        {**course, "BACKFILL_DRIFT_LABELS": "solution_leak"}
    ).checks.drift_labels
    with pytest.raises(SettingsError, match="BACKFILL_DRIFT_LABELS"):
        Settings.from_env({**course, "BACKFILL_DRIFT_LABELS": "spam,abuse"})  # not course labels


def test_blank_means_default_and_values_are_stripped() -> None:
    got = Settings.from_env({"BACKFILL_CONCURRENCY": " 12 ", "BACKFILL_TPM": "  "})
    assert (got.run.concurrency, got.http.tpm) == (12, 0)


def test_settings_read_only_the_mapping_they_are_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BACKFILL_CONCURRENCY", "abc")
    assert Settings.from_env({}).run.concurrency == 8
    assert Settings().run.concurrency == 8  # never os.environ behind the caller's back


def test_the_api_key_is_never_part_of_the_settings() -> None:
    got = Settings.from_env({"BACKFILL_MODEL_API_KEY": "sk-secret-123"})
    assert got.api_key_set
    assert "sk-secret-123" not in repr(got) and "sk-secret-123" not in str(got.model_dump())


def _pg_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    root = Path(__file__).resolve().parents[2]
    (home / "dagster.yaml").write_text((root / "deploy" / "dagster.postgres.yaml").read_text())
    return home


@pytest.mark.pg
def test_a_driverless_instance_url_is_pinned_to_psycopg2(
    tmp_path: Path, pg_available: bool
) -> None:
    """``DAGSTER_PG_URL=postgresql://...`` (no driver) works as the store's URL does; before,
    SQLAlchemy picked psycopg (v3), not installed, and the command died with a traceback."""
    if not pg_available:
        pytest.skip("PostgreSQL not available")
    from backfill_tests.conftest import pg_database

    with pg_database("bf_inst") as url:
        _pg_home(tmp_path)
        (tmp_path / "posts.jsonl").write_text(
            '{"tenant_id": "acme", "post_id": "p1", "text": "hi"}\n'
        )
        driverless = url.replace("postgresql+psycopg2://", "postgresql://")
        got = _cli(["import", "posts.jsonl"], tmp_path, DAGSTER_PG_URL=driverless)
        assert got.returncode == 0, got.stderr
        assert "Traceback" not in got.stderr


def test_an_unreachable_instance_exits_2_without_its_password(tmp_path: Path) -> None:
    _pg_home(tmp_path)
    (tmp_path / "posts.jsonl").write_text("")
    url = "postgresql+psycopg2://dagster:s3cret-pw@127.0.0.1:9/dagster"  # port 9: nothing there
    got = _cli(["import", "posts.jsonl"], tmp_path, DAGSTER_PG_URL=url)
    assert got.returncode == 2, got.stderr
    assert "cannot open the Dagster instance of" in got.stderr
    assert "s3cret-pw" not in got.stderr + got.stdout
    assert "Traceback" not in got.stderr
