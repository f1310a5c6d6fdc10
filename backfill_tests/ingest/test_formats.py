"""CSV and Parquet exports import the same posts, keys and rejects as the equivalent JSONL;
each format's hostile files are rejected or refused, never half-imported as a success."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy.engine import Engine

from backfill_assets.domain.work.columns import ColumnMap
from backfill_assets.domain.work.records import MAX_LINE_BYTES
from backfill_assets.ingest.csv_rows import MAX_RECORD_BYTES
from backfill_assets.ingest.importer import (
    BATCH_TEXT_CHARS,
    ImportInputError,
    ImportOptions,
    import_path,
)
from backfill_assets.ingest.parquet_rows import MAX_FOOTER_BYTES, MAX_PAGE_BYTES
from backfill_tests.ingest.exports import (
    RECORDS,
    SECRET,
    counts,
    csv_bytes,
    rec,
    rejects,
    stored,
    write_as,
    write_jsonl,
    write_parquet,
)


@pytest.mark.parametrize("fmt", ["csv", "csv.gz", "parquet", "jsonl"])
@pytest.mark.parametrize("mapped", [False, True], ids=["own-names", "mapped"])
def test_every_format_gives_the_jsonl_posts_keys_and_rejects(
    engine: Engine,
    tmp_path: Path,
    fmt: str,
    mapped: bool,
    jsonl_truth: tuple[dict[str, object], list[Any], list[Any]],
) -> None:
    names = {"tenant_id": "workspace", "post_id": "id", "text": "body"} if mapped else {}
    path = write_as(fmt, tmp_path, RECORDS, names)
    columns = ColumnMap.parse("tenant_id=workspace,post_id=id,text=body" if mapped else None)
    got = import_path(engine, path, slice_target=0, options=ImportOptions(columns=columns))
    want_counts, want_posts, want_rejects = jsonl_truth
    assert counts(got) == want_counts
    assert stored(engine) == want_posts
    assert [(reason, t) for _, reason, t in rejects(engine)] == want_rejects
    assert all(SECRET not in str(r) for r in rejects(engine))
    if fmt.startswith("csv"):
        # A record's line is where it starts: the header is line 1, p2's record spans 3 lines.
        assert [line for line, _, _ in rejects(engine)][:2] == [7, 8]


def test_a_rerun_of_a_csv_counts_everything_unchanged(lite: Engine, tmp_path: Path) -> None:
    path = write_as("csv", tmp_path, RECORDS[:3], {})
    assert import_path(lite, path).imported == 3
    again = import_path(lite, path)
    assert (again.imported, again.updated, again.unchanged) == (0, 0, 3)


def _csv(tmp_path: Path, body: bytes, name: str = "hostile.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(b"tenant_id,post_id,text\n" + body)
    return path


def test_a_broken_csv_quote_stops_at_its_line_and_keeps_what_came_before(
    engine: Engine, tmp_path: Path
) -> None:
    body = b'acme,p1,one\nacme,p2,"two"oops\nacme,p3,"three,\nacme,p4,four\n'
    path = _csv(tmp_path, body)
    with pytest.raises(ImportInputError, match=r"line 3: broken CSV at line 3: .*rows before it"):
        import_path(engine, path)
    assert [r[1] for r in stored(engine)] == ["p1"]
    assert rejects(engine)[0][:2] == (3, "broken CSV at line 3: ',' expected after '\"'")


def test_a_quote_that_never_closes_stops_at_the_record_cap(lite: Engine, tmp_path: Path) -> None:
    filler = b"".join(b"acme,p%d,%s\n" % (i, SECRET.encode()) for i in range(20_000))
    path = _csv(tmp_path, b'acme,p0,"open\n' + filler)
    with pytest.raises(ImportInputError, match=f"longer than {MAX_RECORD_BYTES} bytes"):
        import_path(lite, path)
    assert stored(lite) == []
    ((line, reason, _),) = rejects(lite)
    assert line == 2 and SECRET not in reason


def test_a_csv_quote_open_at_the_end_of_the_file_is_broken(lite: Engine, tmp_path: Path) -> None:
    path = _csv(tmp_path, b'acme,p1,one\nacme,p2,"never closed\n')
    with pytest.raises(ImportInputError, match="unexpected end of data"):
        import_path(lite, path)
    assert [r[1] for r in stored(lite)] == ["p1"]


def test_bad_bytes_and_long_lines_reject_their_row_and_the_rest_goes_on(
    lite: Engine, tmp_path: Path
) -> None:
    long_line = b"acme,p3," + b"x" * (MAX_RECORD_BYTES + 10) + b"\n"
    body = b"acme,p1,caf\xe9\n" + b"acme,p2,ok\n" + long_line + b"acme,p4,a,extra\nacme,p5,fine\n"
    got = import_path(lite, _csv(tmp_path, body))
    assert (got.read, got.imported, got.rejected) == (5, 2, 3)
    assert [r[1] for r in stored(lite)] == ["p2", "p5"]
    assert [r[:2] for r in rejects(lite)] == [
        (2, "line is not valid UTF-8"),
        (4, f"line longer than {MAX_RECORD_BYTES} bytes"),
        (5, "expected 3 columns as in the header, got 4"),
    ]


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (b"tenant_id,id,text\n", "no column for post_id (from post_id or postId)"),
        (b"tenant_id,post_id,post_id,text\n", "names column(s) twice: post_id"),
        (b"\xff\xfe,t\n", "header is not valid UTF-8"),
    ],
)
def test_a_csv_header_without_the_needed_columns_is_refused_before_anything(
    lite: Engine, tmp_path: Path, header: bytes, message: str
) -> None:
    path = tmp_path / "bad-header.csv"
    path.write_bytes(header + b"acme,p1,one\n")
    with pytest.raises(ImportInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        import_path(lite, path)
    assert stored(lite) == [] and rejects(lite) == []


def test_a_truncated_csv_gzip_says_the_rows_before_it_were_imported(
    lite: Engine, tmp_path: Path
) -> None:
    body = b"".join(b"acme,p%d,text %d\n" % (i, i) for i in range(5000))
    packed = gzip.compress(b"tenant_id,post_id,text\n" + body)
    path = tmp_path / "cut.csv.gz"
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(ImportInputError, match=r"unreadable after line .* were imported"):
        import_path(lite, path)
    kept = len(stored(lite))
    assert 0 < kept < 5000


def test_a_parquet_column_of_another_type_refuses_the_file(lite: Engine, tmp_path: Path) -> None:
    path = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"tenant_id": ["acme"], "post_id": [17], "text": ["x"]}), path)
    with pytest.raises(ImportInputError, match="column post_id is int64, not text"):
        import_path(lite, path)
    assert stored(lite) == []


@pytest.mark.parametrize("keep", [0.5, 0.98])
def test_a_truncated_parquet_file_is_refused(lite: Engine, tmp_path: Path, keep: float) -> None:
    whole = write_parquet(tmp_path / "whole.parquet", RECORDS * 10, {})
    data = whole.read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ImportInputError, match="not a readable Parquet file"):
        import_path(lite, cut)
    assert stored(lite) == []


def test_dictionary_encoded_and_large_strings_are_text(lite: Engine, tmp_path: Path) -> None:
    path = tmp_path / "dict.parquet"
    table = pa.table(
        {
            "tenant_id": pa.array(["acme", "acme"]).dictionary_encode(),
            "post_id": pa.array(["p1", "p2"], pa.large_string()),
            "text": ["one", None],
        }
    )
    pq.write_table(table, path)
    got = import_path(lite, path)
    assert (got.imported, got.rejected) == (1, 1)
    assert rejects(lite)[0][:2] == (2, "text must be a string, got NoneType")


def test_the_format_is_decided_by_content_and_format_overrides(
    lite: Engine, tmp_path: Path
) -> None:
    as_txt = tmp_path / "export.txt"
    as_txt.write_bytes(csv_bytes(RECORDS[:2], {}))
    assert import_path(lite, as_txt).imported == 2
    misnamed = write_jsonl(tmp_path / "really-jsonl.csv", RECORDS[2:3], {})
    assert import_path(lite, misnamed).imported == 1
    with pytest.raises(ImportInputError, match="no column for"):
        import_path(lite, misnamed, options=ImportOptions(format="csv"))
    gz_parquet = tmp_path / "p.parquet.gz"
    gz_parquet.write_bytes(
        gzip.compress(write_parquet(tmp_path / "p.parquet", RECORDS, {}).read_bytes())
    )
    with pytest.raises(ImportInputError, match="gzip-compressed Parquet"):
        import_path(lite, gz_parquet)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_an_import_bound_to_a_tenant_rejects_every_other_tenant(
    engine: Engine, tmp_path: Path, fmt: str
) -> None:
    records = [
        rec("acme", "p1", "mine"),
        rec("globex", "p2", SECRET),
        rec("acme", "p3", "mine too"),
    ]
    path = write_as(fmt, tmp_path, records, {})
    got = import_path(engine, path, options=ImportOptions(tenant="acme"))
    assert (got.imported, got.rejected) == (2, 1)
    assert {r[0] for r in stored(engine)} == {"acme"}
    ((_, reason, tenant),) = rejects(engine)
    assert reason == "tenant_id 'globex' is not acme, the tenant this import is bound to"
    assert tenant == "globex"


def test_a_bound_import_gives_its_tenant_to_rows_that_name_none(
    lite: Engine, tmp_path: Path
) -> None:
    path = tmp_path / "acme-only.csv"
    path.write_bytes(b"post_id,text\np1,one\np2,two\n")
    with pytest.raises(ImportInputError, match="no column for tenant_id"):
        import_path(lite, path)
    got = import_path(lite, path, options=ImportOptions(tenant="acme"))
    assert got.imported == 2 and {r[0] for r in stored(lite)} == {"acme"}


def _posts_table(texts: list[str], **columns: list[object]) -> pa.Table:
    return pa.table(
        {
            **columns,
            "tenant_id": ["acme"] * len(texts),
            "post_id": [f"p{i + 1}" for i in range(len(texts))],
            "text": texts,
        }
    )


@pytest.mark.parametrize("dictionary", [True, False], ids=["dictionary", "plain"])
def test_a_parquet_row_longer_than_a_jsonl_line_is_rejected_by_its_number(
    engine: Engine, tmp_path: Path, dictionary: bool
) -> None:
    path = tmp_path / "long.parquet"
    long = "x" * (MAX_LINE_BYTES + 1)
    texts = ["one", long, "three", long, "five"]
    options = {"use_dictionary": dictionary, "write_batch_size": 1, "data_page_size": 1024}
    pq.write_table(_posts_table(texts), path, compression="zstd", **options)
    got = import_path(engine, path)
    assert (got.imported, got.rejected) == (3, 2)
    reason = f"row longer than {MAX_LINE_BYTES} bytes"
    assert rejects(engine) == [(2, reason, None), (4, reason, None)]


def test_a_parquet_page_over_the_limit_stops_the_file_at_its_row_group(
    engine: Engine, tmp_path: Path
) -> None:
    path = tmp_path / "pages.parquet"
    texts = ["one", "two", "x" * (MAX_PAGE_BYTES + 1), "four"]
    pq.write_table(_posts_table(texts), path, row_group_size=2, compression="zstd")
    assert path.stat().st_size < 64 * 1024
    with pytest.raises(ImportInputError, match=r"line 3: row group 2: column text has a page of"):
        import_path(engine, path)
    assert [r[1] for r in stored(engine)] == ["p1", "p2"]
    assert rejects(engine)[-1][:1] == (3,)


def test_parquet_metadata_over_the_limit_is_refused_before_anything(
    lite: Engine, tmp_path: Path
) -> None:
    path = tmp_path / "footer.parquet"
    table = _posts_table(["one"])
    big = table.replace_schema_metadata({"note": "n" * (MAX_FOOTER_BYTES + 1)})
    pq.write_table(big, path, compression="zstd")
    with pytest.raises(ImportInputError, match=r"Parquet metadata is \d+ bytes, more than"):
        import_path(lite, path)
    assert stored(lite) == []


def test_parquet_columns_are_found_past_nested_ones(lite: Engine, tmp_path: Path) -> None:
    path = tmp_path / "nested.parquet"
    extra = {"meta": [{"a": 1, "b": [1, 2]}, {"a": 2, "b": []}], "x.y": ["s", "t"]}
    pq.write_table(_posts_table(["one", "two"], **extra), path)
    assert import_path(lite, path).imported == 2
    assert [r[4] for r in stored(lite)] == ["one", "two"]


def test_long_posts_are_written_in_batches_of_bounded_text(lite: Engine, tmp_path: Path) -> None:
    texts = [f"{i:05d}" + "x" * 30_000 for i in range(300)]
    path = tmp_path / "long.parquet"
    pq.write_table(_posts_table(texts), path)
    batches: list[int] = []
    got = import_path(lite, path, progress=lambda _name, summary: batches.append(summary.read))
    assert got.imported == 300
    # 300 x 30,005 characters: more than one batch of BATCH_TEXT_CHARS, each under it.
    assert len(batches) > 2
    widths = [b - a for a, b in zip([0, *batches], batches, strict=False)]
    assert max(widths) * 30_005 < BATCH_TEXT_CHARS + 30_005


@pytest.mark.parametrize("statistics", [True, False], ids=["footer", "read"])
def test_parquet_rows_with_no_values_are_one_reject_a_run(
    lite: Engine, tmp_path: Path, statistics: bool
) -> None:
    # Nulls cost a Parquet file no bytes: a refusal a row would let a few KB write millions
    # of rejects. Row groups the footer says are empty are refused unread; without
    # statistics the runs are found batch by batch and joined across batches and groups.
    blank = pa.nulls(50_000, pa.string())
    table = pa.table(
        {
            name: pa.chunked_array([[first], blank, [None], blank, [last]])
            for name, first, last in (
                ("tenant_id", "acme", "acme"),
                ("post_id", "p1", "p2"),
                ("text", "one", "two"),
            )
        }
    )
    path = tmp_path / "empty.parquet"
    pq.write_table(table, path, row_group_size=10_000, write_statistics=statistics)
    got = import_path(lite, path, options=ImportOptions(batch_rows=4_096))
    assert (got.imported, got.rejected, got.read) == (2, 100_001, 100_003)
    assert rejects(lite) == [(2, "no value in any of tenant_id, post_id, text", None)]
    assert got.new_rejects == 100_001
