"""The page headers of a Parquet column chunk, read without decompressing a data page.

A page's header says how many bytes it decompresses to, and the reader allocates that much
before it looks at a value: a 2 KB file can promise gigabytes. The footer's sizes are only a
claim about the pages, so the headers themselves are read (Thrift compact protocol, the fields
``parquet.thrift`` gives ``PageHeader``) and the file's pages judged by them before a row is read.
A dictionary page (one per chunk, already held to the page limit) is decompressed to learn
its longest value: every row may name that value.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import pyarrow as pa

# parquet.thrift: PageType and Encoding values this reader tells apart.
DICTIONARY_PAGE = 2
DICTIONARY_ENCODINGS = frozenset({2, 8})  # PLAIN_DICTIONARY, RLE_DICTIONARY
DELTA_BYTE_ARRAY = 7

# Arrow's own bound on a page header; statistics make headers of a few KiB at most.
MAX_HEADER_BYTES = 16 * 1024 * 1024
_FIRST_READ = 16 * 1024
_MAX_DEPTH = 32

# Thrift compact types.
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)


class BadPageHeader(ValueError):
    """Bytes where a page header should be that are not one."""


@dataclass(frozen=True, slots=True)
class Page:
    """What one page header promises, and where its (compressed) bytes start."""

    offset: int
    kind: int
    uncompressed: int
    compressed: int
    values: int
    encoding: int | None


class _Short(Exception):
    """The header goes on past the bytes read so far."""


class _Compact:
    """A cursor over Thrift compact bytes (only what reading ``PageHeader`` needs)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise _Short
        self.pos += 1
        return self.data[self.pos - 1]

    def varint(self) -> int:
        out = 0
        for shift in range(0, 70, 7):
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
        raise BadPageHeader("a varint longer than 10 bytes")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def fields(self) -> Iterator[tuple[int, int]]:
        """(field id, type) of a struct's fields, up to its stop byte."""
        last = 0
        while True:
            head = self.byte()
            kind = head & 0x0F
            if kind == 0:
                return
            delta = head >> 4
            last = last + delta if delta else self.zigzag()
            yield last, kind

    def skip(self, kind: int, depth: int = 0) -> None:
        if depth > _MAX_DEPTH:
            raise BadPageHeader("nested too deeply")
        if kind in (_TRUE, _FALSE):
            return
        if kind == _BYTE:
            self.byte()
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self._advance(8)
        elif kind == _BINARY:
            self._advance(self.varint())
        elif kind in (_LIST, _SET):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):
                self.skip(_element(head & 0x0F), depth + 1)
        elif kind == _MAP:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    self.skip(_element(types >> 4), depth + 1)
                    self.skip(_element(types & 0x0F), depth + 1)
        elif kind == _STRUCT:
            for _, inner in self.fields():
                self.skip(inner, depth + 1)
        else:
            raise BadPageHeader(f"unknown Thrift type {kind}")

    def _advance(self, n: int) -> None:
        if self.pos + n > len(self.data):
            raise _Short
        self.pos += n


def _element(kind: int) -> int:
    """The type of an element of a list or map: a bool there is a byte of its own."""
    return _BYTE if kind in (_TRUE, _FALSE) else kind


def _page_header(data: bytes) -> tuple[Page, int]:
    """The page a header describes and the header's length in bytes."""
    cur = _Compact(data)
    top: dict[int, int] = {}
    values, encoding = 0, None
    for fid, kind in cur.fields():
        if fid in (1, 2, 3) and kind == _I32:
            top[fid] = cur.zigzag()
        elif fid in (5, 7, 8) and kind == _STRUCT:
            # DataPageHeader, DictionaryPageHeader: 1 num_values, 2 encoding;
            # DataPageHeaderV2: 1 num_values, 4 encoding.
            at = 4 if fid == 8 else 2
            for inner, inner_kind in cur.fields():
                if inner in (1, at) and inner_kind == _I32:
                    got = cur.zigzag()
                    values, encoding = (got, encoding) if inner == 1 else (values, got)
                else:
                    cur.skip(inner_kind)
        else:
            cur.skip(kind)
    if len(top) != 3:
        raise BadPageHeader("a page header without its type and sizes")
    page = Page(0, top[1], top[2], top[3], values, encoding)
    if page.uncompressed < 0 or page.compressed < 0 or page.values < 0:
        raise BadPageHeader("a page header with a negative size")
    return page, cur.pos


def chunk_pages(fh: BinaryIO, start: int, length: int, file_size: int) -> Iterator[Page]:
    """Every page header of the column chunk of ``length`` bytes at ``start``, in order."""
    end = min(start + length, file_size)
    pos = start
    while pos < end:
        want = _FIRST_READ
        while True:
            fh.seek(pos)
            data = fh.read(min(want, file_size - pos))
            try:
                page, used = _page_header(data)
                break
            except _Short:
                if len(data) < want or want >= MAX_HEADER_BYTES:
                    raise BadPageHeader(
                        f"a page header at byte {pos} runs past the file "
                        f"or {MAX_HEADER_BYTES} bytes"
                    ) from None
                want *= 4
        yield Page(
            pos + used, page.kind, page.uncompressed, page.compressed, page.values, page.encoding
        )
        pos += used + page.compressed


# pyarrow's codec for each Parquet compression it can decompress on its own (Parquet's LZ4 is
# Hadoop-framed, not an LZ4 frame).
_CODECS = {
    "SNAPPY": "snappy",
    "GZIP": "gzip",
    "BROTLI": "brotli",
    "ZSTD": "zstd",
    "LZ4_RAW": "lz4_raw",
}


def longest_dictionary_value(fh: BinaryIO, page: Page, compression: str) -> int | None:
    """The longest value of a dictionary page of byte arrays (PLAIN: a 4-byte length, then the
    bytes); ``None`` when it cannot be told here (another codec, values that do not fit)."""
    fh.seek(page.offset)
    raw = fh.read(page.compressed)
    if compression == "UNCOMPRESSED":
        data = memoryview(raw)
    elif compression in _CODECS:
        try:
            codec = pa.Codec(_CODECS[compression])
            data = memoryview(codec.decompress(raw, decompressed_size=page.uncompressed))
        except (pa.ArrowException, ValueError):
            return None
    else:
        return None
    pos, longest = 0, 0
    for _ in range(page.values):
        if pos + 4 > len(data):
            return None
        (length,) = struct.unpack_from("<i", data, pos)
        pos += 4 + length
        if length < 0 or pos > len(data):
            return None
        longest = max(longest, length)
    return longest
