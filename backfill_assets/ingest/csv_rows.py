"""CSV exports (RFC 4180: a header line, comma-separated, double-quoted fields), row by row.

Each record becomes named values by its header and is rejected with the line it starts on.
What the parser cannot get past with confidence ends the file at that line (``InputBroken``): a
quote that does not close, a character after a closing quote, a record longer than the cap.
Going on after a broken quote would read the text of posts as if it were columns. No line or
field is ever held past the cap: a 2 GB field costs 64 KiB reads, not 2 GB.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from typing import Any

from backfill_assets.domain.work.records import Record, Rejection, shown
from backfill_assets.ingest.formats import ColumnsFor, ImportInputError, named_columns
from backfill_assets.ingest.lines import InputBroken, LineSource, read_line

# A record (its lines together) is at most this long; also below the csv module's field
# limit (131,072 characters), so no field can hit that limit before the record cap does.
MAX_RECORD_BYTES = 128 * 1024


class _LineTooLong(Exception):
    """The first line of a record is over the cap (its rest was skipped)."""


class _Feed:
    """Lines for ``csv.reader``, decoded, counted and capped per record."""

    def __init__(self, fh: LineSource, cap: int) -> None:
        self._fh = fh
        self.cap = cap
        self.line_no = 0
        self.record_bytes = 0
        self.bad_utf8 = False
        self.record_start = 0

    def start_record(self) -> None:
        self.record_bytes = 0
        self.bad_utf8 = False
        self.record_start = self.line_no + 1

    def __iter__(self) -> _Feed:
        return self

    def __next__(self) -> str:
        raw, cut = read_line(self._fh, self.cap)
        if not raw and not cut:
            raise StopIteration
        self.line_no += 1
        first = self.line_no == self.record_start
        if cut:
            if first:
                raise _LineTooLong
            raise InputBroken(self.record_start, self._too_long())
        self.record_bytes += len(raw)
        if self.record_bytes > self.cap:
            raise InputBroken(self.record_start, self._too_long())
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            # Bytes that are not UTF-8 never hide a delimiter or a quote (those are ASCII),
            # so the row is parsed as usual and rejected as a whole.
            self.bad_utf8 = True
            return raw.decode("utf-8", "surrogateescape")

    def _too_long(self) -> str:
        return (
            f"CSV record from line {self.record_start} is longer than {self.cap} bytes "
            "(a quoted field that never closes?); nothing after it was read"
        )


def csv_records(
    fh: LineSource, where: str, columns_for: ColumnsFor
) -> Iterator[Record | Rejection]:
    """Records of a CSV export, named by its header; ``where`` names it in a refusal."""
    cap = min(MAX_RECORD_BYTES, csv.field_size_limit())
    feed = _Feed(fh, cap)
    reader = csv.reader(feed, strict=True)
    header = _header(reader, feed, where)
    if header is None:
        return
    width = len(header)
    used = set(named_columns(where, columns_for, header))
    wanted = [(i, name) for i, name in enumerate(header) if name in used]
    while True:
        feed.start_record()
        try:
            record = next(reader)
        except StopIteration:
            return
        except _LineTooLong:
            yield Rejection(feed.record_start, f"line longer than {cap} bytes", None)
            continue
        except csv.Error as exc:
            raise InputBroken(
                feed.record_start, f"broken CSV at line {feed.line_no}: {exc}"
            ) from None
        if not record:
            continue  # a blank line
        line = feed.record_start
        values = {name: record[i] for i, name in wanted if i < len(record)}
        if feed.bad_utf8:
            yield Rejection(line, "line is not valid UTF-8", None)
        elif len(record) != width:
            reason = f"expected {width} columns as in the header, got {len(record)}"
            yield Record(line, values, problem=reason)
        else:
            yield Record(line, values)


def _header(reader: Any, feed: _Feed, where: str) -> list[str] | None:
    """The header's column names, each named once; ``None`` for an empty file."""
    feed.start_record()
    try:
        header = next(reader)
        while not header:
            feed.start_record()
            header = next(reader)
    except StopIteration:
        return None
    except _LineTooLong:
        raise ImportInputError(f"{where}: the CSV header is longer than {feed.cap} bytes") from None
    except (InputBroken, csv.Error) as exc:
        raise ImportInputError(f"{where}: unreadable CSV header: {exc}") from None
    if feed.bad_utf8:
        raise ImportInputError(f"{where}: the CSV header is not valid UTF-8")
    names = [h.strip() for h in header]
    names[0] = names[0].removeprefix("\ufeff")  # a byte-order mark some exporters write
    if len(set(names)) != len(names):
        twice = sorted({shown(n) for n in names if names.count(n) > 1})
        raise ImportInputError(f"{where}: the CSV header names column(s) twice: {', '.join(twice)}")
    return names
