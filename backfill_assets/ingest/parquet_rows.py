"""Parquet exports, read a row group at a time, in batches sized by bytes (pyarrow).

The schema is checked before any row is read: a needed column that is missing or not text
refuses the file with nothing imported (a Parquet column has one type, so one wrong value
means they all are). A truncated file has no footer and is refused the same way. A page that
cannot be decoded halfway through ends the file there (``InputBroken``).

Memory follows the bytes a batch decompresses to, not its row count: a few KB of zstd can hold
gigabytes of text. Before a row group is read, its pages' headers are read (``parquet_pages``):
a page that would decompress to more than ``MAX_PAGE_BYTES`` ends the file there, and the
batch size is chosen so a batch holds about ``BATCH_BYTES`` however values repeat (a dictionary
value is counted for every row that names it). A row longer than a JSONL line may be is
rejected by its lengths, before its values become Python strings.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from backfill_assets.domain.work.records import MAX_LINE_BYTES, Record, Rejection, rows_locator
from backfill_assets.ingest.formats import ColumnsFor, ImportInputError, named_columns
from backfill_assets.ingest.lines import InputBroken
from backfill_assets.ingest.parquet_pages import (
    DELTA_BYTE_ARRAY,
    DICTIONARY_ENCODINGS,
    DICTIONARY_PAGE,
    BadPageHeader,
    Page,
    chunk_pages,
    longest_dictionary_value,
)

# What one page may decompress to. Writers keep pages near 1 MiB (pyarrow: ``data_page_size``,
# checked every ``write_batch_size`` = 1,024 rows), and reading one costs about three times
# its size, so a file within this stays well inside the import's memory.
MAX_PAGE_BYTES = 16 * 1024 * 1024
# Decoded bytes of the needed columns that one batch holds, about.
BATCH_BYTES = 2 * 1024 * 1024
# The footer (schema, row groups, statistics) is decoded whole before anything else.
MAX_FOOTER_BYTES = 8 * 1024 * 1024
# Read through a buffered stream, a column chunk at a time: the whole row group is never
# loaded at once.
_READ_BUFFER = 1 << 20
_FOOTER_TAIL = 8  # footer length (4 bytes, little-endian) + "PAR1"


def _is_text(kind: Any) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_string_view(kind)
        or pa.types.is_null(kind)
    )


def _leaves(kind: Any) -> int:
    """How many Parquet columns (leaves) an Arrow type is stored as."""
    if pa.types.is_struct(kind):
        return sum(_leaves(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _leaves(kind.key_type) + _leaves(kind.item_type)
    if hasattr(kind, "value_type") and not pa.types.is_dictionary(kind):
        return _leaves(kind.value_type)  # list types
    return 1


def _footer_size(path: Path) -> int:
    """What the footer's length field says (0 when the file does not end like Parquet)."""
    with path.open("rb") as fh:
        fh.seek(0, 2)
        if fh.tell() < _FOOTER_TAIL:
            return 0
        fh.seek(-_FOOTER_TAIL, 2)
        tail = fh.read(_FOOTER_TAIL)
    return int.from_bytes(tail[:4], "little") if tail[4:] == b"PAR1" else 0


def open_parquet(path: Path) -> Any:
    """The file, its footer read; ``ImportInputError`` if it is not a readable Parquet file."""
    footer = _footer_size(path)
    if footer > MAX_FOOTER_BYTES:
        raise ImportInputError(
            f"{path}: its Parquet metadata is {footer} bytes, more than the {MAX_FOOTER_BYTES} "
            "an import reads; nothing was imported"
        )
    try:
        return pq.ParquetFile(path, buffer_size=_READ_BUFFER, pre_buffer=False)
    except (pa.ArrowException, OSError) as exc:
        raise ImportInputError(
            f"{path}: not a readable Parquet file (truncated or corrupt?): {exc}"
        ) from None


def _is_loose(kind: Any) -> bool:
    """A list of text or a timestamp: what a ``loose`` column may also be."""
    if pa.types.is_timestamp(kind):
        return True
    return bool(pa.types.is_list(kind) or pa.types.is_large_list(kind)) and _is_text(
        kind.value_type
    )


def _is_number(kind: Any) -> bool:
    return bool(pa.types.is_floating(kind) or pa.types.is_integer(kind))


def _needed(
    path: Path,
    pf: Any,
    columns_for: ColumnsFor,
    loose: Collection[str] = (),
    numbers: Collection[str] = (),
) -> dict[str, int]:
    """The columns to read, each with its Parquet column index, checked to be text (or, for
    ``loose`` ones, a list of text or a timestamp; for ``numbers``, a number)."""
    schema = pf.schema_arrow
    names = list(schema.names)
    needed = named_columns(str(path), columns_for, names)
    if len(set(needed)) != len(needed) or any(names.count(n) > 1 for n in needed):
        raise ImportInputError(f"{path}: the Parquet schema names a column twice")
    leaf, out = 0, {}
    for name in names:
        kind = schema.field(name).type
        if name in needed:
            if not (
                _is_text(kind)
                or (name in loose and _is_loose(kind))
                or (name in numbers and _is_number(kind))
            ):
                raise ImportInputError(
                    f"{path}: column {name} is {kind}, not text; export it as a string column "
                    "(e.g. CAST(id AS VARCHAR)); nothing was imported"
                )
            out[name] = leaf
        leaf += _leaves(kind)
    return {name: out[name] for name in needed}


def parquet_records(
    path: Path,
    columns_for: ColumnsFor,
    batch_rows: int,
    loose: Collection[str] = (),
    numbers: Collection[str] = (),
) -> Iterator[Record | Rejection]:
    """Rows of a Parquet export as named values; a row's line is its number in the file.
    ``loose``: columns that may also be lists of text or timestamps (a decision's rules and
    time); ``numbers``: columns that may also be numbers (a baseline's scores); both checked
    by the caller row by row."""
    pf = open_parquet(path)
    needed = _needed(path, pf, columns_for, loose, numbers)
    meta = pf.metadata
    row_no = 0
    with path.open("rb") as fh:
        for group in range(meta.num_row_groups):
            empty = _empty_group(meta.row_group(group), needed)
            if empty:
                # Refused from the footer alone: a file that lies in its statistics loses rows
                # it says are empty, never reads more than it says.
                where = rows_locator(row_no + 1, empty)
                yield Rejection(row_no + 1, _empty_reason(needed), None, where, rows=empty)
                row_no += empty
                continue
            try:
                rows = _batch_rows(path, pf, fh, group, needed, batch_rows)
            except (BadPageHeader, _PageTooLarge) as exc:
                raise InputBroken(row_no + 1, f"row group {group + 1}: {exc}") from None
            batches = pf.iter_batches(
                batch_size=rows, row_groups=[group], columns=list(needed), use_threads=False
            )
            while True:
                try:
                    batch = next(batches, None)
                except (pa.ArrowException, OSError) as exc:
                    reason = f"unreadable Parquet data after row {row_no}: {exc}"
                    raise InputBroken(row_no + 1, reason) from None
                if batch is None:
                    break
                yield from _batch_records(batch, needed, row_no)
                row_no += batch.num_rows


def _empty_reason(needed: dict[str, int]) -> str:
    return f"no value in any of {', '.join(needed)}"


def _empty_group(group: Any, needed: dict[str, int]) -> int:
    """The row group's row count when its statistics say every needed column is all null."""
    rows = int(group.num_rows)
    for index in needed.values():
        stats = group.column(index).statistics
        if rows == 0 or stats is None or not stats.has_null_count or stats.null_count != rows:
            return 0
    return rows


class _PageTooLarge(ValueError):
    """A page that decompresses to more than the import reads at once."""


def _chunk_start(col: Any) -> int:
    start = int(col.data_page_offset)
    dictionary = col.dictionary_page_offset
    if col.has_dictionary_page and dictionary and 0 < dictionary < start:
        start = int(dictionary)
    return start


def _batch_rows(
    path: Path, pf: Any, fh: BinaryIO, group: int, needed: dict[str, int], most: int
) -> int:
    """Rows per batch in ``group`` so that a batch holds about ``BATCH_BYTES``, judged by the
    page headers (what the reader will allocate), not by the footer's totals."""
    meta = pf.metadata.row_group(group)
    size = path.stat().st_size
    row_bytes = 0
    for name, index in needed.items():
        col = meta.column(index)
        pages = list(chunk_pages(fh, _chunk_start(col), int(col.total_compressed_size), size))
        _check_pages(name, pages)
        row_bytes += _value_bound(fh, str(col.compression), pages, most)
    return max(1, min(most, BATCH_BYTES // max(row_bytes, 1)))


def _check_pages(name: str, pages: list[Page]) -> None:
    for page in pages:
        big = max(page.uncompressed, page.compressed)
        # Each value of a DELTA_BYTE_ARRAY page may repeat the one before it whole, and the
        # reader decodes a few at a time: such a page is held to a quarter.
        limit = MAX_PAGE_BYTES // (4 if page.encoding == DELTA_BYTE_ARRAY else 1)
        if big > limit:
            raise _PageTooLarge(
                f"column {name} has a page of {big} bytes, more than the {limit} an import "
                "decompresses at once (write the export with smaller pages, e.g. pyarrow's "
                "write_batch_size=64); nothing after it was read"
            )


def _value_bound(fh: BinaryIO, compression: str, pages: list[Page], most: int) -> int:
    """The bytes one value of the chunk may decode to, as far as sizing a batch needs: the
    mean of a plain page (a batch spans whole pages), the page itself for DELTA_BYTE_ARRAY
    (a value may repeat its predecessor), and the longest dictionary value, which every row
    may name."""
    bound, named = 1, False
    for page in pages:
        if page.kind == DICTIONARY_PAGE:
            continue
        if page.encoding in DICTIONARY_ENCODINGS:
            named = True
        elif page.encoding == DELTA_BYTE_ARRAY:
            bound = max(bound, page.uncompressed)
        else:
            bound = max(bound, math.ceil(page.uncompressed / max(page.values, 1)))
    dictionary = next((p for p in pages if p.kind == DICTIONARY_PAGE), None)
    if named and dictionary is not None:
        longest: int | None = dictionary.uncompressed
        if dictionary.uncompressed * most > BATCH_BYTES:
            # Only when it would shrink the batch: decompress the page to measure its values.
            longest = longest_dictionary_value(fh, dictionary, compression)
        bound = max(bound, dictionary.uncompressed if longest is None else longest)
    return bound


def _lengths(column: Any) -> list[int]:
    """Bytes of each value of a column, nulls 0 (a dictionary value counted per row)."""
    if pa.types.is_null(column.type):
        return [0] * len(column)
    if pa.types.is_timestamp(column.type) or _is_number(column.type):
        return [8] * len(column)
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        # A list's values joined: its bytes, give or take a separator each.
        column = pc.binary_join(column, "\x1f")
    if pa.types.is_dictionary(column.type):
        lengths = pc.take(pc.binary_length(column.dictionary), column.indices)
    else:
        lengths = pc.binary_length(column)
    return [n or 0 for n in lengths.to_pylist()]


def _blank_rows(batch: Any) -> list[bool] | None:
    """Which rows have no value in any needed column (``None``: no such row)."""
    mask = None
    for column in batch.columns:
        nulls = pc.is_null(column)
        mask = nulls if mask is None else pc.and_(mask, nulls)
    if mask is None or not pc.any(mask).as_py():
        return None
    return [bool(b) for b in mask.to_pylist()]


def _values(column: Any) -> list[Any]:
    """A column's Python values; a timestamp with a zone as naive UTC (Arrow holds UTC), so no
    time zone database decides what the instant is."""
    if pa.types.is_timestamp(column.type) and column.type.tz is not None:
        column = column.cast(pa.timestamp(column.type.unit))
    return list(column.to_pylist())


def _batch_records(batch: Any, needed: dict[str, int], before: int) -> Iterator[Record | Rejection]:
    """The batch's rows; a row whose values are longer than a JSONL line may be is rejected by
    their lengths, before any of its values becomes a Python string. Rows with no values at
    all are refused a run at a time: they cost a file no bytes, so there may be billions."""
    totals = [sum(row) for row in zip(*(_lengths(c) for c in batch.columns), strict=True)]
    over = {i for i, n in enumerate(totals) if n > MAX_LINE_BYTES}
    blank = _blank_rows(batch) or [False] * len(totals)
    if over or any(blank):
        keep = [i not in over and not blank[i] for i in range(len(totals))]
        batch = batch.filter(pa.array(keep))
    rows = zip(*(_values(c) for c in batch.columns), strict=True)
    names, empty = list(needed), _empty_reason(needed)
    i = 0
    while i < len(totals):
        row_no = before + i + 1
        if blank[i]:
            end = i
            while end < len(totals) and blank[end]:
                end += 1
            yield Rejection(row_no, empty, None, rows_locator(row_no, end - i), rows=end - i)
            i = end
            continue
        if i in over:
            reason = f"row longer than {MAX_LINE_BYTES} bytes"
            yield Rejection(row_no, reason, None, f"row {row_no}")
        else:
            yield Record(row_no, dict(zip(names, next(rows), strict=True)), f"row {row_no}")
        i += 1
