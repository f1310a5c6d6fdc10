"""Human output: rich tables, and live progress only on a terminal."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from rich.console import Console

from backfill_assets.cli.progress import ProgressDisplay, wanted
from backfill_assets.cli.tables import show, table
from backfill_tests.cli_runs import clean_env, last_json


def test_tables_keep_values_verbatim_and_whole_when_piped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    long = "x" * 150
    rows = [
        {"name": "a", "n": 5, "reason": "does not match ^[a-z0-9][a-z0-9-]{0,39}$"},
        {"name": long, "n": 12345, "reason": None},
    ]
    show(table(rows, ["name", "n", "reason"]), "a line", table([], ["name"], title="empty"))
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["name", "n", "reason"]
    assert "^[a-z0-9][a-z0-9-]{0,39}$" in out[2]  # not read as rich markup
    assert out[3].startswith(long) and out[3].rstrip().endswith("-")  # not cropped or wrapped
    assert out[2].index("5") + 1 == out[3].index("12345") + 5  # numbers right-aligned
    assert out[4:] == ["a line", "empty: (no rows)"]


def test_progress_is_a_no_op_unless_enabled(capsys: pytest.CaptureFixture[str]) -> None:
    assert not wanted()  # pytest captures stdout and stderr: no terminal
    display = ProgressDisplay("keys", enabled=False)
    display.update("acme", 10, 100, tokens=5)
    display.close()
    assert capsys.readouterr() == ("", "")


def test_progress_rows_show_done_total_rate_and_counters() -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=160, color_system=None)
    with ProgressDisplay("keys", enabled=True, console=console) as display:
        display.update("acme", 1200, 5000, tokens=81000, cost="$0.02", retries=3)
        display.update("globex", 7, None)
        display.update("acme", 2400, 5000, tokens=162000, cost="$0.04", retries=3)
    out = buf.getvalue()
    assert "2,400/5,000 keys" in out and "keys/s" in out
    assert "tokens 162,000" in out and "cost $0.04" in out and "retries 3" in out
    assert "7/? keys" in out


def _run_on_terminal(argv: list[str], env: dict[str, str]) -> str:
    """Run with stdin, stdout and stderr on a pseudo-terminal; everything it drew."""
    master, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    proc = subprocess.Popen(argv, stdin=child, stdout=child, stderr=child, env=env)
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=120) == 0, b"".join(chunks)[-2000:]
    os.close(master)
    return b"".join(chunks).decode("utf-8", "replace")


def test_import_draws_progress_on_a_terminal_only(tmp_path: Path) -> None:
    export = tmp_path / "posts.jsonl"
    with export.open("w") as fh:
        for i in range(5000):
            fh.write(json.dumps({"tenant_id": "acme", "post_id": f"p{i}", "text": f"t{i}"}) + "\n")
    env = clean_env()
    env.update(
        BACKFILL_DATABASE_URL=f"sqlite:///{tmp_path / 's.db'}",
        DAGSTER_HOME=str(tmp_path / "home"),
        TERM="xterm-256color",
    )
    env.pop("NO_COLOR", None)
    cmd = [sys.executable, "-m", "backfill_assets.cli", "import", str(export)]
    drawn = _run_on_terminal(cmd, env)
    assert "posts.jsonl" in drawn and "5,000/? lines" in drawn and "lines/s" in drawn, drawn
    assert "imported 5,000" in drawn and "rejected 0" in drawn

    # --json on a terminal, or output to a pipe: no progress at all.
    drawn = _run_on_terminal([*cmd, "--json"], env)
    assert "lines/s" not in drawn and last_json(drawn)["read"] == 5000
    piped = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and "lines/s" not in piped.stderr + piped.stdout
    assert piped.stdout.split()[:6] == [
        "file",
        "read",
        "imported",
        "updated",
        "unchanged",
        "rejected",
    ]
