"""Pure parts of the import: bounded line reads, the column map, URL redaction."""

from __future__ import annotations

import io

import pytest

from backfill_assets.domain.urls import redact_url, scrub
from backfill_assets.domain.work.columns import ColumnMap, ColumnMapError
from backfill_assets.domain.work.records import Post, Rejection, validate_row
from backfill_assets.ingest.lines import bounded_lines


class _Recorder(io.BytesIO):
    """A stream that remembers the largest read it was asked for."""

    largest = 0

    def readline(self, size: int | None = -1, /) -> bytes:
        assert size is not None and size > 0, "an unbounded readline"
        self.largest = max(self.largest, size)
        return super().readline(size)


def test_a_long_line_is_skipped_in_chunks_never_read_whole() -> None:
    huge = b"x" * (8 * 1024 * 1024)
    fh = _Recorder(b"first\n" + huge + b"\nlast\r\n" + b"y" * 11)
    got = list(bounded_lines(fh, 10))
    assert got == [(1, b"first"), (2, None), (3, b"last"), (4, None)]
    assert fh.largest <= 64 * 1024


def test_a_line_of_exactly_the_cap_is_kept() -> None:
    assert list(bounded_lines(io.BytesIO(b"0123456789\n0123456789"), 10)) == [
        (1, b"0123456789"),
        (2, b"0123456789"),
    ]


def test_the_column_map_reads_mapped_names_only() -> None:
    columns = ColumnMap.parse("tenant_id=workspace, post_id=id,text=body")
    got = validate_row(
        {"workspace": "acme", "id": "p1", "body": "hi", "tenant_id": "x"}, 3, columns
    )
    assert isinstance(got, Post) and (got.tenant_id, got.post_id, got.line) == ("acme", "p1", 3)
    missing = validate_row({"tenant_id": "acme", "post_id": "p1", "text": "hi"}, 4, columns)
    assert isinstance(missing, Rejection)
    assert missing.reason == "missing field(s): tenant_id, post_id, text"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("tenant=workspace", "unknown field 'tenant'"),
        ("text", "expected FIELD=COLUMN"),
        ("text=a,text=b", "mapped twice"),
        ("text=a,post_id=a", "same column"),
        ("text=", "expected FIELD=COLUMN"),
    ],
)
def test_a_bad_map_is_refused(spec: str, message: str) -> None:
    with pytest.raises(ColumnMapError, match=message):
        ColumnMap.parse(spec)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:s3cr%40t@db:5432/posts", "postgresql://app:***@db:5432/posts"),
        ("postgresql+psycopg2://app@db/posts", "postgresql+psycopg2://app@db/posts"),
        (
            "mysql://u:pw@h/db?password=pw2&charset=utf8",
            "mysql://u:***@h/db?password=***&charset=utf8",
        ),
        ("sqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
    ],
)
def test_urls_are_shown_without_their_secrets(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_scrub_masks_a_password_wherever_a_driver_put_it() -> None:
    url = "postgresql://app:s3cr%40t@db/posts"
    text = f"could not connect to {url}: password s3cr@t rejected (s3cr%40t)"
    out = scrub(text, url)
    assert "s3cr" not in out and "***" in out
