"""Parquet exports, read in record batches of the needed columns only (pyarrow).

The schema is checked before any row is read: a needed column that is missing or not text
refuses the file with nothing imported (a Parquet column has one type, so one wrong value
means they all are). A truncated file has no footer and is refused the same way. A page that
cannot be decoded halfway through ends the file there (``InputBroken``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from backfill_assets.core.records import Record, Rejection
from backfill_assets.ingest.formats import ColumnsFor, ImportInputError, named_columns
from backfill_assets.ingest.lines import InputBroken

# Read through a buffered stream, a column chunk at a time: the whole row group is never
# loaded at once, so memory follows the batch and not the file's row group size.
_READ_BUFFER = 1 << 20


def _is_text(kind: Any) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_string_view(kind)
        or pa.types.is_null(kind)
    )


def open_parquet(path: Path) -> Any:
    """The file, its footer read; ``ImportInputError`` if it is not a readable Parquet file."""
    try:
        return pq.ParquetFile(path, buffer_size=_READ_BUFFER, pre_buffer=False)
    except (pa.ArrowException, OSError) as exc:
        raise ImportInputError(
            f"{path}: not a readable Parquet file (truncated or corrupt?): {exc}"
        ) from None


def parquet_records(
    path: Path, columns_for: ColumnsFor, batch_rows: int
) -> Iterator[Record | Rejection]:
    """Rows of a Parquet export as named values; a row's line is its number in the file."""
    pf = open_parquet(path)
    schema = pf.schema_arrow
    needed = named_columns(str(path), columns_for, list(schema.names))
    if len(set(needed)) != len(needed):
        raise ImportInputError(f"{path}: the Parquet schema names a column twice")
    for name in needed:
        kind = schema.field(name).type
        if not _is_text(kind):
            raise ImportInputError(
                f"{path}: column {name} is {kind}, not text; export it as a string column "
                "(e.g. CAST(id AS VARCHAR)); nothing was imported"
            )
    row_no = 0
    batches = pf.iter_batches(batch_size=batch_rows, columns=needed, use_threads=False)
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as exc:
            reason = f"unreadable Parquet data after row {row_no}: {exc}"
            raise InputBroken(row_no + 1, reason) from None
        if batch is None:
            return
        values = [batch.column(i).to_pylist() for i in range(len(needed))]
        for cells in zip(*values, strict=True):
            row_no += 1
            yield Record(row_no, dict(zip(needed, cells, strict=True)), f"row {row_no}")
