"""Gold sets are read by the import's readers (one per format), so a gold set follows every
rule an export of posts does: lines end at a newline only, a header names each column once, a
quote that never closes stops the file, gzip and Parquet are read as an import reads them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from backfill_assets.ingest.gold import GoldError, read_gold


def _ids(path: Path) -> list[str]:
    return [row.post.post_id for row in read_gold(path, "eval").rows]


def test_a_line_separator_inside_a_json_string_does_not_split_the_line(tmp_path: Path) -> None:
    gold = tmp_path / "gold.jsonl"
    rows = [
        {"id": "g1", "text": "one", "label": "ok"},
        {"id": "g2", "text": "a\u2028b\u2029c\x85d", "label": "ok"},
    ]
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    gold.write_text("\n".join([*lines, "{broken", ""]), encoding="utf-8")
    got = read_gold(gold, "eval")
    assert [(r.post.post_id, r.post.text) for r in got.rows] == [
        ("g1", "one"),
        ("g2", "a\u2028b\u2029c\x85d"),
    ]
    # The broken line is the third line of the file, as a posts import numbers it.
    assert [(r.line, r.reason.split(":")[0]) for r in got.rejected] == [(3, "invalid JSON")]


def test_a_csv_header_that_names_a_column_twice_is_refused(tmp_path: Path) -> None:
    gold = tmp_path / "gold.csv"
    gold.write_text("id,text,label,label\ng1,x,ok,spam\n")
    with pytest.raises(GoldError, match=r"names column\(s\) twice: label"):
        read_gold(gold, "eval")


def test_a_quote_that_never_closes_refuses_the_gold_set_at_its_line(tmp_path: Path) -> None:
    gold = tmp_path / "gold.csv"
    gold.write_text('id,text,label\ng1,fine,ok\ng2,"never closed,ok\ng3,fine,ok\ng4,x,spam\n')
    with pytest.raises(GoldError, match="line 3: broken CSV") as caught:
        read_gold(gold, "eval")
    assert "fine" not in str(caught.value)


def test_a_line_that_is_not_utf8_is_rejected_and_the_rest_read(tmp_path: Path) -> None:
    gold = tmp_path / "gold.csv"
    gold.write_bytes(b"id,text,label\ng1,\xff\xfe,ok\ng2,fine,ok\n")
    got = read_gold(gold, "eval")
    assert [r.post.post_id for r in got.rows] == ["g2"]
    assert [(r.line, r.reason) for r in got.rejected] == [(2, "line is not valid UTF-8")]


def test_gzip_and_parquet_gold_sets_read_like_exports(tmp_path: Path) -> None:
    rows = [{"id": "g1", "text": "one", "label": "ok"}, {"id": "g2", "text": "t", "label": "x"}]
    jsonl = tmp_path / "gold.jsonl.gz"
    jsonl.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    parquet = tmp_path / "gold.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    assert _ids(jsonl) == _ids(parquet) == ["g1", "g2"]


def test_a_csv_or_parquet_gold_set_with_an_unknown_column_is_refused(tmp_path: Path) -> None:
    gold = tmp_path / "gold.csv"
    gold.write_text("id,text,label,colour\ng1,x,ok,red\n")
    with pytest.raises(GoldError, match=r"unknown column.*colour"):
        read_gold(gold, "eval")
    parquet = tmp_path / "gold.parquet"
    pq.write_table(pa.table({"id": ["g1"], "text": ["x"], "label": ["ok"], "n": [1]}), parquet)
    with pytest.raises(GoldError, match=r"unknown column\(s\) in a gold set: n$"):
        read_gold(parquet, "eval")


def test_a_gold_set_that_is_not_a_readable_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(GoldError, match="no such file"):
        read_gold(tmp_path / "missing.csv", "eval")
    with pytest.raises(GoldError, match="directory"):
        read_gold(tmp_path, "eval")


def test_a_gold_set_is_held_to_as_many_refusals_as_rows(tmp_path: Path) -> None:
    # Refusals are held in memory like rows; each line here differs, so none join a run.
    path = tmp_path / "gold.jsonl"
    good = json.dumps({"id": "g0", "text": "fine", "label": "ok"})
    bad = (
        json.dumps({"id": f"g{i}", "text": "x", "label": "NOT A LABEL"}) for i in range(1, 100_002)
    )
    path.write_text("\n".join([good, *bad]) + "\n")
    with pytest.raises(GoldError, match="more than 100000 rows rejected"):
        read_gold(path, "eval")


def test_empty_parquet_gold_rows_count_as_rows_in_few_refusals(tmp_path: Path) -> None:
    blank = pa.nulls(200_000, pa.string())
    table = pa.table(
        {
            name: pa.chunked_array([[value], blank])
            for name, value in (("id", "g1"), ("text", "fine"), ("label", "ok"))
        }
    )
    path = tmp_path / "gold.parquet"
    pq.write_table(table, path, write_statistics=False)
    gold = read_gold(path, "eval")
    assert len(gold.rows) == 1
    assert gold.rejected_rows == 200_000
    assert [(r.line, r.rows, r.locator) for r in gold.rejected] == [(2, 200_000, "rows 2-200001")]
