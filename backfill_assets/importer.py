"""Stream a JSONL export into the store, a bounded batch at a time."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sqlalchemy.engine import Engine

from .records import Post, Rejection, parse_line
from .store.engine import refresh_planner_stats
from .store.posts import ImportSummary, write_batch

BATCH_LINES = 2000


def import_jsonl(
    engine: Engine,
    path: Path,
    source: str | None = None,
    progress: Callable[[ImportSummary], None] | None = None,
) -> ImportSummary:
    """Import ``path``; bad lines are recorded in ``rejected_records`` and the import goes on."""
    summary = ImportSummary()
    src = source or str(path.resolve())
    batch: list[Post | Rejection] = []
    with path.open("rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            parsed = parse_line(raw.rstrip(b"\r\n"), line_no)
            if parsed is None:
                continue
            summary.read += 1
            batch.append(parsed)
            if len(batch) >= BATCH_LINES:
                write_batch(engine, src, batch, summary)
                batch = []
                if progress is not None:
                    progress(summary)
    if batch:
        write_batch(engine, src, batch, summary)
    refresh_planner_stats(engine, ("tenants", "posts"))
    return summary
