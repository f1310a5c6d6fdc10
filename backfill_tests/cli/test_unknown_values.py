"""A mistyped tenant, slice, outcome, check name or file exits 2, names it and suggests a fix.

Every command that takes ``--tenant`` is run in-process through ``main`` (what the console
script calls), and one through a real subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from backfill_assets.cli import batch_run, main
from backfill_assets.domain.work.keys import SLICE_KEYS
from backfill_tests.cli_runs import clean_env
from backfill_tests.conftest import import_records
from backfill_tests.moderation_helpers import records

TENANTS = ["acme", "globex", "initech"]
TYPO = "unknown tenant 'acmee'; did you mean acme?"


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """SQLite: the validation is the CLI's, not the store's."""
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
def cli_env(
    engine: Engine, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """Three tenants imported, one rejected line in ``posts.jsonl``; ``main`` reads os.environ."""
    recs: list[Any] = [r for t in TENANTS for r in records(t, 3)]
    import_records(engine, tmp_path, [*recs, '{"tenant_id": "acme", "post_id": 7}'], "posts.jsonl")
    env = {"BACKFILL_DATABASE_URL": store_url, "DAGSTER_HOME": str(tmp_path / "home")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


class _FakeWebserver(BaseHTTPRequestHandler):
    """Answers ``launch``'s GraphQL reads: every partition of the three tenants, all missing."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        query, variables = body["query"], body.get("variables", {})
        node: dict[str, Any]
        if "staleStatusByPartition" in query:
            node = {"staleStatusByPartition": ["MISSING" for _ in variables["partitions"]]}
        elif "assetChecksOrError" in query:
            node = {"assetChecksOrError": {"__typename": "AssetChecks", "checks": []}}
        else:
            keys = [f"{s}|{t}" for s in SLICE_KEYS for t in TENANTS]
            node = {
                "__typename": "AssetNode",
                "partitionKeys": keys,
                "assetPartitionStatuses": {"ranges": []},
            }
        data = json.dumps({"data": {"assetNodeOrError": node}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def webserver() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeWebserver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _unknown_tenant_cases(url: str) -> list[list[str]]:
    return [
        ["run", "--tenant", "acmee"],
        ["run", "--tenant", "acme", "--tenant", "acmee"],
        ["check", "--tenant", "acmee"],
        ["verify", "--tenant", "acmee"],
        ["verify", "--require-complete", "--tenant", "acmee", "--json"],
        ["dry-run", "--tenant", "acmee"],
        ["requeue", "--tenant", "acmee", "--outcome", "schema_rejected"],
        ["rejects", "--tenant", "acmee"],
        ["launch", "--missing", "--tenant", "acmee", "--url", url, "--dry-run"],
    ]


def test_every_tenant_command_refuses_an_unknown_tenant(
    cli_env: dict[str, str], webserver: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in _unknown_tenant_cases(webserver):
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        assert f"argument --tenant: {TYPO}" in err, (argv, err)


def test_launch_selects_for_a_known_tenant(
    cli_env: dict[str, str], webserver: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fake webserver is sound: a known tenant gets its 16 missing partitions."""
    argv = ["launch", "--missing", "--tenant", "acme", "--url", webserver, "--dry-run", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["partitions"] == 16 and [b["tenant"] for b in doc["backfills"]] == ["acme"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "--tenant", "ACME"], "did you mean acme?"),
        (["run", "--slice", "s16"], "argument --slice: unknown slice 's16'"),
        (["run", "--slice", "99"], "expected s00..s15 or 0..15"),
        (["check", "--tenant", "acme", "--slice", "x"], "unknown slice 'x'; expected s00..s15"),
        (
            ["check", "--tenant", "acme", "--name", "coverag"],
            "argument --name: unknown check 'coverag'; did you mean coverage?",
        ),
        (
            ["requeue", "--tenant", "acme", "--outcome", "schema_rejectd"],
            "argument --outcome: unknown outcome 'schema_rejectd'; did you mean schema_rejected?",
        ),
        (
            ["requeue", "--tenant", "acme", "--outcome", "deferred"],
            "unknown outcome 'deferred'; known: schema_rejected, transport_rejected",
        ),
        (
            ["rejects", "--file", "post.jsonl"],
            "unknown file 'post.jsonl'; did you mean posts.jsonl?",
        ),
        (["rejects", "--tenant", "globx"], "unknown tenant 'globx'; did you mean globex?"),
    ],
)
def test_unknown_values_exit_2_with_a_suggestion(
    cli_env: dict[str, str], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and message in err, err


def test_known_values_still_work(
    cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dry-run", "--tenant", "acme", "--json"]) == 0
    assert [t["tenant"] for t in json.loads(capsys.readouterr().out)["tenants"]] == ["acme"]
    assert main(["requeue", "--tenant", "globex", "--outcome", "retry_exhausted", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requeued"] == 0
    # A rejected line's tenant value is known to `rejects` even when it is no valid tenant id.
    assert main(["rejects", "--tenant", "acme", "--file", "posts.jsonl", "--json"]) == 0
    assert [r["line"] for r in json.loads(capsys.readouterr().out)["rejects"]] == [10]


def test_batch_run_refuses_an_unknown_tenant(
    cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BACKFILL_MODEL_BACKEND", "openai")
    monkeypatch.setenv("BACKFILL_MODEL_BASE_URL", "http://127.0.0.1:9/v1")
    assert batch_run.main(["--tenant", "acmee"]) == 2
    assert TYPO in capsys.readouterr().err


def test_a_real_process_exits_2_for_an_unknown_tenant(cli_env: dict[str, str]) -> None:
    env = clean_env(**cli_env)
    out = subprocess.run(
        [sys.executable, "-m", "backfill_assets.cli", "check", "--tenant", "acmee"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    assert f"backfill-moderation check: error: argument --tenant: {TYPO}" in out.stderr
