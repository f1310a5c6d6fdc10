"""One reader per export format, for imports and gold sets alike: a file's rows as records of
named values, each format's rules applied (bounded lines and records, UTF-8, quoting, a header
that names each column once, Parquet pages and column types) before any field is validated."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

from backfill_assets.domain.work.records import Record, Rejection
from backfill_assets.ingest.csv_rows import csv_records
from backfill_assets.ingest.formats import ColumnsFor, Format, open_bytes
from backfill_assets.ingest.jsonl_rows import jsonl_records

# Rows a Parquet batch holds at most (fewer when their bytes say so).
BATCH_ROWS = 2000


@contextmanager
def file_records(
    path: Path,
    fmt: Format,
    columns_for: ColumnsFor,
    batch_rows: int = BATCH_ROWS,
    loose: Collection[str] = (),
    numbers: Collection[str] = (),
) -> Iterator[Iterator[Record | Rejection]]:
    """The records of ``path`` read as ``fmt``; ``columns_for`` picks the columns a header or
    schema must have (a JSON line names its own). ``loose``: Parquet columns that may also be
    lists of text or timestamps; ``numbers``: Parquet columns that may also be numbers."""
    if fmt == "parquet":
        # pyarrow (~0.15 s) loads with the first Parquet file read, not in every process that
        # might read one (a no-op `run` imports this module through the definitions).
        from backfill_assets.ingest.parquet_rows import parquet_records

        yield parquet_records(path, columns_for, batch_rows, loose, numbers)
        return
    with open_bytes(path) as fh:
        yield csv_records(fh, str(path), columns_for) if fmt == "csv" else jsonl_records(fh)
