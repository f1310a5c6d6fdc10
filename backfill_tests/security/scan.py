"""Search for secrets and post text where they must never be: store tables, files, outputs.

A needle counts as found if any run of ``WINDOW`` of its characters is found (case-insensitive),
so a truncated or re-cased copy is caught too. SQLite files are also read table by table and
every blob is tried as zlib: Dagster keeps run and job snapshots compressed in ``snapshots``.
"""

from __future__ import annotations

import contextlib
import sqlite3
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

WINDOW = 16
_SQLITE_MAGIC = b"SQLite format 3\x00"


def _windows(needle: str) -> list[bytes]:
    raw = needle.lower().encode("utf-8")
    if len(raw) <= WINDOW:
        return [raw]
    return sorted({raw[i : i + WINDOW] for i in range(len(raw) - WINDOW + 1)})


def found_in(data: bytes, needles: Sequence[str]) -> list[str]:
    """The needles (a window of them) that ``data`` holds."""
    low = data.lower()
    return [n for n in needles if any(w in low for w in _windows(n))]


def text_leaks(name: str, text: str, needles: Sequence[str]) -> list[str]:
    """``name: needle`` for each needle in ``text`` (CLI output, a GraphQL answer)."""
    return [f"{name}: {n}" for n in found_in(text.encode("utf-8"), needles)]


def store_leaks(
    engine: Engine, needles: Sequence[str], allowed: Iterable[str] = ("posts",)
) -> list[str]:
    """``table: needle`` for every table of the store but ``allowed`` that holds a needle."""
    skip = set(allowed)
    out: list[str] = []
    meta = sa.MetaData()
    meta.reflect(engine)
    with engine.connect() as conn:
        for table in meta.sorted_tables:
            if table.name in skip:
                continue
            for row in conn.execute(sa.select(table)):
                hits = found_in(repr(tuple(row)).encode("utf-8"), needles)
                out += [f"{table.name}: {n}" for n in hits]
    return sorted(set(out))


def _sqlite_leaks(path: Path, needles: Sequence[str]) -> list[str]:
    out: list[str] = []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                for value in row:
                    data = value if isinstance(value, bytes) else str(value).encode("utf-8")
                    if isinstance(value, bytes):
                        with contextlib.suppress(zlib.error):
                            data = zlib.decompress(value)
                    out += [f"{path}:{table}: {n}" for n in found_in(data, needles)]
    finally:
        conn.close()
    return out


def tree_leaks(root: Path, needles: Sequence[str]) -> list[str]:
    """``file: needle`` for every file under ``root`` holding a needle (SQLite read inside)."""
    out: list[str] = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        out += [f"{path}: {n}" for n in found_in(data, needles)]
        if data.startswith(_SQLITE_MAGIC):
            out += _sqlite_leaks(path, needles)
    return sorted(set(out))
