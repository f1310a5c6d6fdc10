"""Dagster's local compute logs, mirrored to the terminal by a thread instead of four processes.

Dagster 1.13's ``LocalComputeLogManager`` captures a run's stdout and stderr into files under
``$DAGSTER_HOME/storage`` (the UI's stdout/stderr tabs read them) and, to keep showing them
where they were going, starts per stream a ``tail -F`` and a Python process that watches for
the run's process to die and kills the tail: four processes a run. A CLI ``run`` over 10,000
small tenants is 20 runs, and those 80 processes were ~1 s of its CPU (Python's start-up is
~20 ms here).

``MirroredComputeLogManager`` writes the same files, in the same places, read the same way, and
copies what is appended to them to where the stream went before, from a thread of the run's
process. It cannot be orphaned (it dies with the process, SIGKILL included), and it shows
output within ``_POLL_SECONDS`` (``tail -F``: a second). The project's instance class makes it
the default (``instance_class.py``), in both ``dagster.yaml`` files.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any

from backfill_assets.accelerators.dagster_private import (
    IO_TYPE_EXTENSION,
    CapturedLogContext,
    ComputeIOType,
    ConfigurableClassData,
    LocalComputeLogManager,
    ensure_file,
    redirect_to_file,
    should_disable_io_stream_redirect,
    touch_file,
)

_POLL_SECONDS = 0.1
_CHUNK = 1 << 16
# A stop waits this long for the thread's last copy (a terminal that does not read blocks it).
_JOIN_SECONDS = 5.0


class MirroredComputeLogManager(LocalComputeLogManager):
    """``LocalComputeLogManager`` whose capture is mirrored by a thread (module docstring)."""

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: Mapping[str, Any]
    ) -> MirroredComputeLogManager:
        """As Dagster's (which names its own class, not ``cls``)."""
        return cls(inst_data=inst_data, **config_value)

    @contextlib.contextmanager
    def capture_logs(self, log_key: Sequence[str]) -> Iterator[CapturedLogContext]:
        """Dagster's capture (the same files and completion marker), mirrored by a thread."""
        out = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDOUT])
        err = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDERR])
        with mirrored(sys.stdout, out), mirrored(sys.stderr, err):
            yield CapturedLogContext(log_key)
        # Dagster's marker that the capture is complete (untyped in Dagster).
        touch_file(self.complete_artifact_path(log_key))  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def mirrored(stream: IO[str], path: str) -> Iterator[None]:
    """While the block runs, ``stream``'s file descriptor writes to ``path``, and what ``path``
    gains is copied to where the descriptor wrote before. A stream without a descriptor (a
    test's capture) is left alone, as Dagster leaves it."""
    ensure_file(path)
    fd = _fileno(stream)
    if fd is None or should_disable_io_stream_redirect():  # type: ignore[no-untyped-call]
        with redirect_to_file(stream, path):
            yield
        return
    target = os.dup(fd)
    copier = _Copier(path, target)
    copier.start()
    try:
        with redirect_to_file(stream, path):
            yield
    finally:
        copier.stop()


def _fileno(stream: IO[str]) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


class _Copier(threading.Thread):
    """Copies what is appended to ``path`` to ``fd`` until stopped, then what is left; closes
    ``fd`` when done (not before: a stop that timed out must not let the number be reused)."""

    def __init__(self, path: str, fd: int) -> None:
        super().__init__(name=f"compute-log-mirror:{os.path.basename(path)}", daemon=True)
        self._path = path
        self._fd = fd
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            self._copy()
        finally:
            os.close(self._fd)

    def _copy(self) -> None:
        with open(self._path, "rb") as source:
            while True:
                # Read the flag first: after a stop, one more pass copies the rest.
                last = self._stopping.is_set()
                chunk = source.read(_CHUNK)
                while chunk:
                    if not self._write(chunk):
                        return
                    chunk = source.read(_CHUNK)
                if last:
                    return
                self._stopping.wait(_POLL_SECONDS)

    def _write(self, data: bytes) -> bool:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._fd, view) :]
            except OSError:
                return False  # the terminal went away: the file keeps everything
        return True

    def stop(self) -> None:
        """Copy the rest and end (the redirect is undone: nothing more is appended)."""
        self._stopping.set()
        self.join(_JOIN_SECONDS)
