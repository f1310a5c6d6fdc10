"""Page headers read without the Parquet reader: for every page version, codec and encoding
pyarrow writes, they add up to what the footer says; a header that is not one, or that
promises more than the import reads, stops the file at its row group."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy.engine import Engine

from backfill_assets.ingest.importer import ImportInputError, import_path
from backfill_assets.ingest.parquet_pages import (
    DICTIONARY_PAGE,
    BadPageHeader,
    Page,
    chunk_pages,
    longest_dictionary_value,
)
from backfill_tests.ingest.exports import stored


def _table(rows: int) -> pa.Table:
    return pa.table(
        {
            "tenant_id": ["acme"] * rows,
            "post_id": [f"p{i}" for i in range(rows)],
            "text": [None if i % 7 == 0 else "t" * (i % 300) for i in range(rows)],
            "flag": [i % 2 == 0 for i in range(rows)],
        }
    )


def _pages(path: Path, group: int, column: int) -> tuple[Any, list[Page]]:
    meta = pq.ParquetFile(path).metadata.row_group(group).column(column)
    start = meta.data_page_offset
    if meta.has_dictionary_page and 0 < meta.dictionary_page_offset < start:
        start = meta.dictionary_page_offset
    with path.open("rb") as fh:
        size = path.stat().st_size
        return meta, list(chunk_pages(fh, start, meta.total_compressed_size, size))


@pytest.mark.parametrize("version", ["1.0", "2.0"])
@pytest.mark.parametrize("codec", ["none", "snappy", "gzip", "zstd", "brotli", "lz4"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"use_dictionary": False},
        {"use_dictionary": False, "column_encoding": {"text": "DELTA_BYTE_ARRAY"}},
        {"use_dictionary": False, "column_encoding": {"text": "DELTA_LENGTH_BYTE_ARRAY"}},
        {"write_page_index": True, "write_page_checksum": True},
    ],
    ids=["dictionary", "plain", "delta", "delta-length", "index-crc"],
)
def test_page_headers_add_up_to_the_footer(
    tmp_path: Path, version: str, codec: str, options: dict[str, Any]
) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(
        _table(3000),
        path,
        compression=codec,
        data_page_version=version,
        data_page_size=512,
        write_batch_size=64,
        row_group_size=1200,
        **options,
    )
    groups = pq.ParquetFile(path).metadata.num_row_groups
    for group in range(groups):
        for column in range(4):
            meta, pages = _pages(path, group, column)
            data = [p for p in pages if p.kind != DICTIONARY_PAGE]
            assert len(data) > 1 or column != 2  # the text column spans pages
            assert sum(p.values for p in data) == meta.num_values
            assert sum(p.compressed for p in pages) < meta.total_compressed_size
            assert sum(p.uncompressed for p in pages) <= meta.total_uncompressed_size


def test_the_longest_dictionary_value_is_read_from_its_page(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    pq.write_table(_table(500), path, compression="zstd")
    meta, pages = _pages(path, 0, 2)
    (dictionary,) = [p for p in pages if p.kind == DICTIONARY_PAGE]
    with path.open("rb") as fh:
        assert longest_dictionary_value(fh, dictionary, meta.compression) == 299
        assert longest_dictionary_value(fh, dictionary, "LZO") is None


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00" * 64,
        b"\xff" * 64,
        b"\x15\x00\x15\x02\x15\x01\x00",
        b"\x15",
        b"\x19\xfc" + b"\x88" * 62,
    ],
    ids=["no-sizes", "unknown-type", "negative-size", "short", "endless-varint"],
)
def test_bytes_that_are_not_a_page_header_are_refused(garbage: bytes) -> None:
    fh = io.BytesIO(garbage)
    with pytest.raises(BadPageHeader):
        list(chunk_pages(fh, 0, len(garbage), len(garbage)))


def test_a_broken_page_header_stops_the_file_after_the_rows_before(
    lite: Engine, tmp_path: Path
) -> None:
    path = tmp_path / "broken.parquet"
    pq.write_table(_table(20).drop_columns(["flag"]), path, row_group_size=10)
    second = pq.ParquetFile(path).metadata.row_group(1).column(2)
    start = second.dictionary_page_offset or second.data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
    with pytest.raises(ImportInputError, match="line 11: row group 2: unknown Thrift type 15"):
        import_path(lite, path)
    assert len(stored(lite)) == 10 - 2  # rows 1 and 8 have no text
