"""Servers the tests start (``bin/dev``, ``bin/prod``, a webserver), each in a session of its
own, and stopped whatever happens.

``bin/dev`` and ``bin/prod`` give each child its own process group, so a group kill of the
script misses the webserver, the daemon and their code servers; the session (one per start)
holds them all. Every session started here is remembered, and ``kill_leftovers`` (called when
the test session finishes, conftest.py) SIGKILLs whatever a test's own teardown did not stop.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

_started: set[int] = set()


def _clean_signals() -> None:
    """In the child: the signal state a process manager gives, whatever this test process's
    is (a signal ignored at a shell's start cannot be trapped, so the script would not stop)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def start_session(
    argv: Sequence[str], env: dict[str, str], cwd: Path, log: Path, append: bool = False
) -> subprocess.Popen[bytes]:
    """``argv`` in a session of its own, output to ``log``, as a process manager starts it."""
    with log.open("ab" if append else "wb") as fh:
        proc = subprocess.Popen(
            list(argv),
            env=env,
            cwd=cwd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_clean_signals,
        )
    _started.add(proc.pid)
    return proc


def session_pids(sid: int) -> list[int]:
    """Live processes of a session (a zombie has ended; in a container PID 1 may never reap
    it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if os.getsid(int(entry.name)) == sid and state != "Z":
                    found.append(int(entry.name))
    return found


def kill_session(sid: int) -> list[int]:
    """SIGKILL every live process of the session, whatever its process group; the pids."""
    pids = session_pids(sid)
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def kill_sessions(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Teardown: SIGKILL every process of the sessions ``procs`` lead, then reap them."""
    for proc in procs:
        kill_session(proc.pid)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def kill_leftovers() -> list[int]:
    """The backstop: SIGKILL what is left of every session started here; the pids killed."""
    killed = [pid for sid in sorted(_started) for pid in kill_session(sid)]
    _started.clear()
    return killed
