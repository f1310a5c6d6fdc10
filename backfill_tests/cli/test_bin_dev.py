"""``bin/dev`` starts quietly (no instance-config or deprecation warnings, rejects said once)
and stops cleanly: SIGTERM ends it within 10 s with nothing left behind."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from backfill_tests.cli_runs import clean_env
from backfill_tests.dagster_dev import ROOT
from backfill_tests.sessions import kill_sessions, session_pids, start_session

# One worker runs the tests that start servers or time a stop, one after another (bin/test).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("servers")]

HINT = "3 lines rejected, see `backfill-moderation rejects`"
NOISE = (
    "Found a dagster instance configuration value",  # dagster.yaml in the working directory
    "SupersessionWarning",
    "superseded",
    "DeprecationWarning",
    "deprecated",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    # One session: webserver, daemon and code server included.
    return start_session([str(ROOT / "bin" / "dev")], env, ROOT, log)


def _wait_for(proc: subprocess.Popen[bytes], log: Path, ready: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        text = log.read_text(errors="replace")
        if ready in text:
            return text
        time.sleep(0.5)
    raise AssertionError(f"no {ready!r} in {timeout}s:\n{log.read_text()[-3000:]}")


def _answers(url: str, timeout: float) -> int:
    """The status of ``url`` once its server accepts connections: dagster-webserver logs
    "Serving ..." before uvicorn binds the port (seen refused right after, under load)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return httpx.get(url, timeout=timeout).status_code
        except httpx.ConnectError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    # Everything in the session this test created, nothing else: bin/dev puts its children in
    # their own process groups, so killing bin/dev's group alone would leave a webserver
    # holding the port for the next start.
    kill_sessions([proc])
    deadline = time.monotonic() + 10
    while session_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def test_bin_dev_starts_without_warnings_and_names_rejects_once(tmp_path: Path) -> None:
    port = _free_port()
    env = clean_env()
    env.update(DAGSTER_HOME=str(tmp_path / "home"), PORT=str(port))
    first = tmp_path / "first.log"
    proc = _start(env, first)
    try:
        _wait_for(proc, first, f"Serving dagster-webserver on http://127.0.0.1:{port}", 240)
        assert _answers(f"http://127.0.0.1:{port}/server_info", 30) == 200
        time.sleep(3)  # the daemon's first ticks
    finally:
        _kill(proc)
    text = first.read_text(errors="replace")
    for noise in NOISE:
        assert noise not in text, text
    assert text.count(HINT) == 1, text
    assert "invalid JSON" not in text and '"rejected"' not in text  # no bad lines, no JSON

    again = tmp_path / "again.log"
    proc = _start(env, again)
    try:
        text = _wait_for(proc, again, f"Serving dagster-webserver on http://127.0.0.1:{port}", 240)
        time.sleep(3)  # the daemon and the code servers are up too
        assert len(session_pids(proc.pid)) >= 3  # bin/dev, webserver, daemon (+ code servers)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # to bin/dev only, as systemd or `timeout` would
        proc.wait(15)
        # Descendants bin/dev killed may take a moment to die after it exits.
        while session_pids(proc.pid) and time.monotonic() - sent < 10:
            time.sleep(0.1)
        assert time.monotonic() - sent < 10
        assert session_pids(proc.pid) == []  # no webserver, daemon or code server left
    finally:
        _kill(proc)
    assert "rejected" not in text, text
