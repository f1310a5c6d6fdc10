"""``bin/dev`` (webserver + daemon, demo data) on a temporary home, for end-to-end tests."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from backfill_tests.cli_runs import ROOT, clean_env
from backfill_tests.sessions import kill_sessions, start_session

DEMO = ROOT / "backfill_assets" / "demo" / "posts.jsonl"


@dataclass
class DagsterDev:
    """A running webserver and how to reach it and its store."""

    base_url: str
    env: dict[str, str]
    store_path: Path
    log_path: Path

    def gql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """One GraphQL call; fails the test on GraphQL errors."""
        resp = httpx.post(
            f"{self.base_url}/graphql",
            json={"query": query, "variables": variables or {}},
            timeout=30,
        )
        resp.raise_for_status()
        doc: dict[str, Any] = resp.json()
        assert not doc.get("errors"), doc["errors"]
        data: dict[str, Any] = doc["data"]
        return data


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_ready(dev: DagsterDev, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, dev.log_path.read_text()[-3000:]
        try:
            node = dev.gql(
                '{ assetNodeOrError(assetKey: {path: ["moderation_labels"]}) { __typename } }'
            )
            if node["assetNodeOrError"]["__typename"] == "AssetNode":
                return
        except (httpx.HTTPError, AssertionError):
            pass
        time.sleep(0.5)
    raise AssertionError(
        f"dagster dev not ready in {timeout}s:\n{dev.log_path.read_text()[-3000:]}"
    )


@contextmanager
def dagster_dev(
    tmp: Path, startup_timeout: float = 120, extra_env: dict[str, str] | None = None
) -> Iterator[DagsterDev]:
    """``bin/dev`` (demo import, webserver, daemon) on a fresh home, ``extra_env`` added to
    its environment; stopped afterwards."""
    home = tmp / "dagster_home"
    home.mkdir(parents=True)
    store = tmp / "store.db"
    env = clean_env()
    port = _free_port()
    env.update(DAGSTER_HOME=str(home), BACKFILL_DATABASE_URL=f"sqlite:///{store}", PORT=str(port))
    env.update(extra_env or {})
    log = tmp / "dagster_dev.log"
    dev = DagsterDev(f"http://127.0.0.1:{port}", env, store, log)
    # Own session: every process bin/dev starts can be found (and killed) by this id.
    proc = start_session([str(ROOT / "bin" / "dev")], env, ROOT, log)
    try:
        _wait_ready(dev, proc, startup_timeout)
        yield dev
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(15)
    # bin/dev's children are in process groups of their own: the whole session, stragglers
    # included.
    kill_sessions([proc])
