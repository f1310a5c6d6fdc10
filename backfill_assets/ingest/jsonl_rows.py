"""JSONL exports: one JSON object a line, each line read up to ``MAX_LINE_BYTES``. Only a
newline ends a line: a U+2028 or a NEL inside a string is text, as JSON says."""

from __future__ import annotations

from collections.abc import Iterator

from backfill_assets.domain.work.records import MAX_LINE_BYTES, Record, Rejection, parse_object
from backfill_assets.ingest.lines import LineSource, bounded_lines


def jsonl_records(fh: LineSource) -> Iterator[Record | Rejection]:
    """Lines of a JSONL export as records of named values (blank lines skipped)."""
    for line_no, raw in bounded_lines(fh, MAX_LINE_BYTES):
        if raw is None:
            yield Rejection(line_no, f"line longer than {MAX_LINE_BYTES} bytes", None)
            continue
        parsed = parse_object(raw, line_no)
        if parsed is not None:
            yield parsed
