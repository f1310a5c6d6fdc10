"""Lines of a byte stream, each read up to a cap: a line longer than that is skipped in
chunks, never held whole (a 500 MiB line costs 64 KiB of memory, not 500 MiB)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO, Protocol

_SKIP_CHUNK = 64 * 1024


class LineSource(Protocol):
    """What ``bounded_lines`` reads: a binary file, plain or decompressing."""

    def readline(self, size: int = -1, /) -> bytes: ...


class InputBroken(Exception):
    """The rest of an input cannot be read with confidence (a broken CSV quote, a corrupt
    Parquet page): the importer keeps what came before, records the line and stops."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(reason)
        self.line = line
        self.reason = reason


def read_line(fh: LineSource | BinaryIO, cap: int) -> tuple[bytes, bool]:
    """The next line with its newline (``b""`` at the end) and whether it was cut: a line of
    more than ``cap`` bytes before its newline comes back as ``b"", True``, its rest skipped."""
    raw = fh.readline(cap + 1)
    if len(raw) <= cap or raw.endswith(b"\n"):
        return raw, False
    while True:
        rest = fh.readline(_SKIP_CHUNK)
        if not rest or rest.endswith(b"\n"):
            return b"", True


def bounded_lines(fh: LineSource | BinaryIO, cap: int) -> Iterator[tuple[int, bytes | None]]:
    """(line number, line without its line ending) in order; ``None`` for a line over ``cap``."""
    line_no = 0
    while True:
        raw, cut = read_line(fh, cap)
        if not raw and not cut:
            return
        line_no += 1
        yield line_no, None if cut else raw.rstrip(b"\r\n")
