"""Chunking of a partition's remaining keys into batch files, and chunk ids (pure).

A chunk never mixes tenants or partitions: it is built from one partition's keys. Lines are
ordered by key and split by line count and file size, so the same keys always give the same
chunks and the same bytes (the file hash recorded at intent).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from backfill_assets.domain.work.keys import Versions


@dataclass(frozen=True, slots=True)
class ChunkLine:
    """One key of a chunk; ``text`` is only ever put into the upload."""

    key: str
    post_id: str
    content_hash: str
    text: str
    attempt_no: int


def chunk_base(versions: Versions, tenant_id: str, slice_no: int, keys: Sequence[str]) -> str:
    """sha256 over versions, partition and sorted keys (length-prefixed, so unambiguous)."""
    digest = hashlib.sha256()
    fields = (
        versions.task_version,
        versions.key_version,
        versions.model,
        tenant_id,
        str(slice_no),
        *sorted(keys),
    )
    for value in fields:
        raw = value.encode("utf-8")
        digest.update(str(len(raw)).encode("ascii") + b":" + raw)
    return digest.hexdigest()


def chunk_id(base: str, seq: int) -> str:
    """The id sent in the batch metadata: short enough for a metadata value, still unique."""
    return f"ck-{base[:32]}-{seq}"


def split(sizes: Sequence[int], max_lines: int, max_bytes: int) -> list[range]:
    """Consecutive index ranges of at most ``max_lines`` lines and ``max_bytes`` bytes each.

    A single line larger than ``max_bytes`` still gets a chunk of its own: the provider then
    fails that batch's validation and the run reports it, instead of the key vanishing.
    """
    if max_lines < 1 or max_bytes < 1:
        raise ValueError("chunk limits must be positive")
    out: list[range] = []
    start, size = 0, 0
    for i, line_bytes in enumerate(sizes):
        full = i - start >= max_lines or (i > start and size + line_bytes > max_bytes)
        if full:
            out.append(range(start, i))
            start, size = i, 0
        size += line_bytes
    if start < len(sizes):
        out.append(range(start, len(sizes)))
    return out
