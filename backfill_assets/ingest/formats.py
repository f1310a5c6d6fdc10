"""Which format a file is in, decided by its content (``--format`` overrides), and its bytes
with gzip undone (by the magic bytes, not the name)."""

from __future__ import annotations

import gzip
import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, get_args

Format = Literal["jsonl", "csv", "parquet"]
FORMATS: tuple[str, ...] = get_args(Format)
EXPORT_PATTERNS = ("*.jsonl", "*.jsonl.gz", "*.csv", "*.csv.gz", "*.parquet")
GZIP_MAGIC = b"\x1f\x8b"
PARQUET_MAGIC = b"PAR1"
_SNIFF_BYTES = 4096
_BOM = b"\xef\xbb\xbf"


class ImportInputError(ValueError):
    """An input that cannot be imported: missing, unreadable, empty directory, corrupt gzip,
    a header or schema without the needed columns.

    ``reason`` is the message without the path, for callers that must not echo the path back
    (a path a launch supplied).
    """

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


# A header or schema's column names -> the columns to read. Raises ``ImportInputError`` (its
# message without the file's name) when the file cannot be read for want of a column.
ColumnsFor = Callable[[list[str]], list[str]]


def named_columns(where: str, columns_for: ColumnsFor, names: list[str]) -> list[str]:
    """``columns_for(names)``, a refusal naming the file ``where``."""
    try:
        return columns_for(names)
    except ImportInputError as exc:
        raise ImportInputError(f"{where}: {exc}") from None


@contextmanager
def open_bytes(path: Path) -> Iterator[io.BufferedIOBase]:
    """The file's bytes, decompressed when it is gzip."""
    with path.open("rb") as raw:
        magic = raw.read(2)
        raw.seek(0)
        if magic == GZIP_MAGIC:
            with gzip.GzipFile(fileobj=raw, mode="rb") as gz:
                yield gz
        else:
            yield raw


def sniff_format(path: Path) -> Format:
    """Parquet by its magic bytes; otherwise JSONL if the first non-blank byte opens a JSON
    object, else CSV (a header line)."""
    with path.open("rb") as raw:
        if raw.read(4) == PARQUET_MAGIC:
            return "parquet"
    try:
        with open_bytes(path) as fh:
            head = fh.read(_SNIFF_BYTES)
    except (OSError, EOFError) as exc:
        raise ImportInputError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    if head.startswith(PARQUET_MAGIC):
        raise ImportInputError(
            f"{path}: gzip-compressed Parquet; Parquet compresses its own pages, import the "
            ".parquet file itself"
        )
    body = head.removeprefix(_BOM).lstrip()
    return "jsonl" if not body or body.startswith(b"{") else "csv"
