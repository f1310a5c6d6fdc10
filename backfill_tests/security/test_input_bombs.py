"""A small hostile file costs the import no more memory than its limits: a 2 KB Parquet file of
10 x 40 MiB texts, Parquet cells of 4 MiB, a CSV field of 256 MiB without a newline, a quote
that never closes, gold sets with a 200 MiB line or field. Each is read by the real command in
a child process whose own peak RSS must stay under 300 MB (``import`` of 10 normal rows takes
about 170 MB, ``evaluate`` about 225 MB); over-long rows are rejected with their numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from backfill_assets.ledger.engines import engine_for
from backfill_tests.cli_runs import clean_env, last_json, run_cli_peak
from backfill_tests.ingest.exports import rejects
from bench.bombs_bench import (
    csv_field_bomb,
    csv_quote_bomb,
    gold_field_bomb,
    gold_line_bomb,
    gold_parquet,
    parquet_cells_bomb,
    parquet_dictionary_bomb,
    parquet_empty_rows_bomb,
)

PEAK_MIB = 300
_MIB = 1 << 20


def _run(
    argv: list[str], tmp_path: Path, store: str | None = None
) -> tuple[int, str, str, float, str]:
    store = store or f"sqlite:///{tmp_path / 'store.db'}"
    env = clean_env(BACKFILL_DATABASE_URL=store, DAGSTER_HOME=str(tmp_path / "home"))
    done, peak = run_cli_peak([*argv, "--json"], env)
    return done.returncode, done.stdout, done.stderr, peak, store


def test_a_2kb_parquet_file_of_400_mib_is_refused_at_its_page(tmp_path: Path) -> None:
    bomb = parquet_dictionary_bomb(tmp_path / "bomb.parquet")
    assert bomb.stat().st_size < 4096
    code, _, err, peak, _ = _run(["import", str(bomb)], tmp_path)
    assert peak < PEAK_MIB, f"peak RSS {peak:.0f} MiB"
    assert code == 2, err
    assert "line 1: row group 1: column text has a page of 41943044 bytes" in err
    assert "Traceback" not in err


def test_parquet_cells_too_long_are_rejected_by_row_before_they_are_read(
    tmp_path: Path, store_url: str
) -> None:
    bomb = parquet_cells_bomb(tmp_path / "cells.parquet", normal=200, bombs=20)
    code, out, err, peak, store = _run(["import", str(bomb)], tmp_path, store_url)
    assert peak < PEAK_MIB, f"peak RSS {peak:.0f} MiB"
    assert code == 0, err
    assert last_json(out)["imported"] == 200
    got = rejects(engine_for(store))
    # Bomb k sits before the (10 k)-th normal row: row 11 k + 1.
    assert [line for line, _, _ in got] == [11 * k + 1 for k in range(20)]
    assert {reason for _, reason, _ in got} == {"row longer than 262144 bytes"}


def test_a_csv_field_of_256_mib_is_skipped_in_chunks(tmp_path: Path, store_url: str) -> None:
    bomb = csv_field_bomb(tmp_path / "field.csv.gz", field_mib=256)
    code, out, err, peak, store = _run(["import", str(bomb)], tmp_path, store_url)
    assert peak < PEAK_MIB, f"peak RSS {peak:.0f} MiB"
    assert code == 0, err
    assert last_json(out)["imported"] == 2
    assert [line for line, _, _ in rejects(engine_for(store))] == [3]


def test_a_csv_quote_that_never_closes_stops_at_its_line(tmp_path: Path) -> None:
    bomb = csv_quote_bomb(tmp_path / "quote.csv.gz", lines=200_000)
    code, _, err, peak, _ = _run(["import", str(bomb)], tmp_path)
    assert peak < PEAK_MIB, f"peak RSS {peak:.0f} MiB"
    assert code == 2
    assert "line 3: CSV record from line 3 is longer than 131072 bytes" in err


@pytest.mark.parametrize("shape", ["jsonl", "csv"])
def test_a_gold_line_or_field_of_200_mib_is_rejected_by_line(tmp_path: Path, shape: str) -> None:
    if shape == "jsonl":
        bomb, line = gold_line_bomb(tmp_path / "gold.jsonl", line_mib=200), 2
    else:
        bomb, line = gold_field_bomb(tmp_path / "gold.csv", field_mib=200), 3
    code, out, err, peak, _ = _run(["evaluate", str(bomb)], tmp_path)
    assert peak < PEAK_MIB, f"peak RSS {peak:.0f} MiB"
    assert code == 0, err
    doc = last_json(out)
    assert doc["gold"]["rows"] == 2
    assert [r["line"] for r in doc["rejected"]] == [line]
    assert "longer than" in doc["rejected"][0]["reason"]


def test_a_parquet_gold_set_is_held_to_the_page_limit(tmp_path: Path) -> None:
    bomb = gold_parquet(tmp_path / "gold.parquet", ["a" * (40 * _MIB)] * 10)
    code, _, err, peak, _ = _run(["evaluate", str(bomb)], tmp_path)
    assert peak < PEAK_MIB, f"peak RSS {peak:.0f} MiB"
    assert code == 2
    assert "argument GOLD" in err and "has a page of 41943044 bytes" in err


def test_millions_of_empty_parquet_rows_are_one_reject(tmp_path: Path, store_url: str) -> None:
    bomb = parquet_empty_rows_bomb(tmp_path / "empty.parquet", rows=3_000_000)
    assert bomb.stat().st_size < 64 * 1024
    code, out, err, peak, store = _run(["import", str(bomb)], tmp_path, store_url)
    assert peak < PEAK_MIB, f"peak RSS {peak:.0f} MiB"
    assert code == 0, err
    doc = last_json(out)
    assert (doc["imported"], doc["rejected"], doc["read"]) == (2, 3_000_000, 3_000_002)
    assert rejects(engine_for(store)) == [(2, "no value in any of tenant_id, post_id, text", None)]
