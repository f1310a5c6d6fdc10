"""Memory of reading hostile files: each bomb beside a normal file of the same row count.

A bomb is a small file that decompresses or parses into a lot: a 2 KB Parquet file of 10 texts
of 40 MiB (zstd, one dictionary value), Parquet cells of 4 MiB among normal rows, a CSV field
of 1 GiB without a newline (gzip), a CSV quote that never closes, and gold sets with a line or
a field of 200 MiB, a gzip line of 1 GiB, or the Parquet bomb; and a Parquet file of a few KB
whose rows have no values (``--empty-rows``, 10 million: nulls cost no bytes; its normal file
is 10,000 posts). Each file is read by the command that takes it (``import``, or ``evaluate``
for a gold set) in a fresh process, and the table shows that process's wall time and peak RSS
beside the same command on a normal file with as many rows.

    bench/run bombs [--field-mib 1024] [--line-mib 200] [--empty-rows 10000000] [--limits]

``--limits`` also imports files that stay within the import's limits but go close to them (a
dictionary value of nearly 16 MiB named by every row, plain pages of 16 MiB, posts of 32 KiB,
200,000 short posts): the target is a peak RSS under 300 MB for any of them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import machine_speed, run_peak
from bench.scale_bench import cli_env

_MIB = 1 << 20
_CHUNK = b"a" * _MIB


def _text(i: int) -> str:
    return f"an ordinary post, number {i}"


def parquet_file(path: Path, texts: list[str], **options: object) -> Path:
    """Posts of tenant ``acme`` with these texts, zstd-compressed."""
    table = pa.table(
        {
            "tenant_id": ["acme"] * len(texts),
            "post_id": [f"p{i}" for i in range(len(texts))],
            "text": texts,
        }
    )
    pq.write_table(table, path, compression="zstd", **options)  # type: ignore[arg-type]
    return path


def parquet_dictionary_bomb(path: Path, rows: int = 10, cell_mib: int = 40) -> Path:
    """The review's file: ``rows`` texts of ``cell_mib`` MiB, one dictionary value (2 KB)."""
    return parquet_file(path, ["a" * (cell_mib * _MIB)] * rows)


def parquet_cells_bomb(path: Path, normal: int = 1000, bombs: int = 100, cell_mib: int = 4) -> Path:
    """``bombs`` texts of ``cell_mib`` MiB (one dictionary value), each followed by
    ``normal // bombs`` posts (bomb k is row ``k * (normal // bombs + 1) + 1``): every page
    stays small enough to read, and the long rows are rejected by their lengths."""
    big, per = "a" * (cell_mib * _MIB), normal // bombs
    texts: list[str] = []
    for k in range(bombs):
        texts += [big, *(_text(k * per + j) for j in range(per))]
    texts += [_text(i) for i in range(bombs * per, normal)]
    return parquet_file(path, texts, dictionary_pagesize_limit=2 * cell_mib * _MIB)


def parquet_empty_rows_bomb(path: Path, rows: int = 10_000_000) -> Path:
    """A post, then ``rows`` rows with no values at all (nulls cost no bytes), then a post:
    a few KB that claim millions of rows, each one a refusal."""
    tenants = pa.chunked_array([["acme"], pa.nulls(rows, pa.string()), ["acme"]])
    posts = pa.chunked_array([["p-first"], pa.nulls(rows, pa.string()), ["p-last"]])
    texts = pa.chunked_array([["fine"], pa.nulls(rows, pa.string()), ["fine"]])
    table = pa.table({"tenant_id": tenants, "post_id": posts, "text": texts})
    pq.write_table(table, path, compression="zstd", row_group_size=1 << 20)
    return path


def csv_field_bomb(path: Path, field_mib: int = 1024) -> Path:
    """A gzip CSV whose third record is one field of ``field_mib`` MiB without a newline."""
    with gzip.open(path, "wb", compresslevel=1) as fh:
        fh.write(b"tenant_id,post_id,text\nacme,p1,fine\nacme,p2,")
        for _ in range(field_mib):
            fh.write(_CHUNK)
        fh.write(b"\nacme,p3,fine\n")
    return path


def csv_quote_bomb(path: Path, lines: int = 1_000_000) -> Path:
    """A gzip CSV whose third record opens a quote that never closes, then ``lines`` lines."""
    with gzip.open(path, "wb", compresslevel=1) as fh:
        fh.write(b'tenant_id,post_id,text\nacme,p1,fine\nacme,p2,"never closed\n')
        line = b"acme,px," + b"b" * 1000 + b"\n"
        for _ in range(lines):
            fh.write(line)
    return path


def csv_file(path: Path, rows: int) -> Path:
    """A normal CSV export of ``rows`` posts."""
    lines = ["tenant_id,post_id,text", *(f"acme,p{i},{_text(i)}" for i in range(rows))]
    path.write_text("\n".join(lines) + "\n")
    return path


def _gold_row(i: int) -> bytes:
    label = "spam" if i % 2 else "ok"
    return json.dumps({"id": f"g{i}", "text": _text(i), "label": label}).encode() + b"\n"


def gold_line_bomb(path: Path, line_mib: int = 200, gz: bool = False) -> Path:
    """A JSONL gold set: two rows, one line of ``line_mib`` MiB between them (gzip: ``gz``)."""
    with gzip.open(path, "wb", compresslevel=1) if gz else path.open("wb") as fh:
        fh.write(_gold_row(1))
        fh.write(b'{"id": "g2", "label": "ok", "text": "')
        for _ in range(line_mib):
            fh.write(_CHUNK)
        fh.write(b'"}\n')
        fh.write(_gold_row(3))
    return path


def gold_field_bomb(path: Path, field_mib: int = 200) -> Path:
    """A CSV gold set: two rows, one unquoted field of ``field_mib`` MiB between them."""
    with path.open("wb") as fh:
        fh.write(b"id,text,label\ng1,fine,ok\ng2,")
        for _ in range(field_mib):
            fh.write(_CHUNK)
        fh.write(b",ok\ng3,fine,spam\n")
    return path


def gold_file(path: Path, rows: int) -> Path:
    """A normal JSONL gold set of ``rows`` rows."""
    path.write_bytes(b"".join(_gold_row(i) for i in range(1, rows + 1)))
    return path


def gold_parquet(path: Path, texts: list[str]) -> Path:
    """A Parquet gold set with these texts (zstd)."""
    table = pa.table(
        {
            "id": [f"g{i}" for i in range(len(texts))],
            "text": texts,
            "label": ["ok"] * len(texts),
        }
    )
    pq.write_table(table, path, compression="zstd")
    return path


@dataclass(frozen=True)
class Bomb:
    """A hostile file, the command that reads it, and a normal file of as many rows."""

    name: str
    command: str
    rows: int
    write: Callable[[Path], Path]
    normal: Callable[[Path], Path]


def bombs(field_mib: int, line_mib: int, empty_rows: int) -> list[Bomb]:
    """The files the bench reads."""
    return [
        Bomb(
            f"Parquet, {empty_rows:,} empty rows",
            "import",
            empty_rows + 2,
            lambda d: parquet_empty_rows_bomb(d / "empty.parquet", empty_rows),
            lambda d: parquet_file(d / "normal.parquet", [_text(i) for i in range(10_000)]),
        ),
        Bomb(
            "Parquet, 10 x 40 MiB (2 KB)",
            "import",
            10,
            lambda d: parquet_dictionary_bomb(d / "bomb.parquet"),
            lambda d: parquet_file(d / "normal.parquet", [_text(i) for i in range(10)]),
        ),
        Bomb(
            "Parquet, 100 x 4 MiB cells",
            "import",
            1100,
            lambda d: parquet_cells_bomb(d / "cells.parquet"),
            lambda d: parquet_file(d / "normal.parquet", [_text(i) for i in range(1100)]),
        ),
        Bomb(
            f"CSV gzip, a {field_mib} MiB field",
            "import",
            3,
            lambda d: csv_field_bomb(d / "field.csv.gz", field_mib),
            lambda d: csv_file(d / "normal.csv", 3),
        ),
        Bomb(
            "CSV gzip, a quote never closed",
            "import",
            3,
            lambda d: csv_quote_bomb(d / "quote.csv.gz"),
            lambda d: csv_file(d / "normal.csv", 3),
        ),
        Bomb(
            f"gold JSONL, a {line_mib} MiB line",
            "evaluate",
            3,
            lambda d: gold_line_bomb(d / "gold.jsonl", line_mib),
            lambda d: gold_file(d / "normal.jsonl", 3),
        ),
        Bomb(
            f"gold CSV, a {line_mib} MiB field",
            "evaluate",
            3,
            lambda d: gold_field_bomb(d / "gold.csv", line_mib),
            lambda d: gold_file(d / "normal.jsonl", 3),
        ),
        Bomb(
            f"gold JSONL gzip, a {field_mib} MiB line",
            "evaluate",
            3,
            lambda d: gold_line_bomb(d / "gold.jsonl.gz", field_mib, gz=True),
            lambda d: gold_file(d / "normal.jsonl", 3),
        ),
        Bomb(
            "gold Parquet, 10 x 40 MiB (2 KB)",
            "evaluate",
            10,
            lambda d: gold_parquet(d / "gold.parquet", ["a" * (40 * _MIB)] * 10),
            lambda d: gold_file(d / "normal.jsonl", 10),
        ),
    ]


def _long_post(i: int) -> str:
    # 32 KiB in UTF-8 with one emoji: Python holds it at 4 bytes a character.
    return f"{i:05d}" + "x" * (32 * 1024 - 9) + "\U0001f600"


def _jsonl_file(path: Path, texts: list[str]) -> Path:
    rows = ({"tenant_id": "acme", "post_id": f"p{i}", "text": t} for i, t in enumerate(texts))
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def within_limits() -> list[tuple[str, Callable[[Path], Path]]]:
    """Files within the import's limits, near them: (name, writer)."""
    near = "a" * (16 * _MIB - 4096)
    return [
        (
            "Parquet, 1,000 rows of one 15.9 MiB value",
            lambda d: parquet_file(
                d / "a.parquet", [near] * 1000, dictionary_pagesize_limit=32 * _MIB
            ),
        ),
        (
            "Parquet, 3,000 posts in 16 MiB pages",
            lambda d: parquet_file(
                d / "b.parquet", [f"{i:05d}" * 3200 for i in range(3000)], use_dictionary=False
            ),
        ),
        (
            "Parquet, 4,000 posts of 32 KiB",
            lambda d: parquet_file(
                d / "c.parquet",
                [_long_post(i) for i in range(4000)],
                use_dictionary=False,
                write_batch_size=256,
            ),
        ),
        (
            "JSONL, 4,000 posts of 32 KiB",
            lambda d: _jsonl_file(d / "c.jsonl", [_long_post(i) for i in range(4000)]),
        ),
        (
            "Parquet, 200,000 short posts",
            lambda d: parquet_file(d / "d.parquet", [_text(i) for i in range(200_000)]),
        ),
    ]


def _outcome(command: str, code: int, stdout: str, stderr: str) -> str:
    if code:
        return f"exit {code}: {stderr.strip().splitlines()[-1].split('error: ', 1)[-1][:90]}"
    doc = json.loads(stdout.strip().splitlines()[-1])
    if command == "import":
        return f"imported {doc.get('imported')}, rejected {doc.get('rejected')}"
    gold = doc["gold"]
    return f"evaluated {gold['rows']}, rejected {gold['rejected']}"


def _measure(bomb: Bomb, path: Path, work: Path) -> tuple[float, str, float]:
    env = cli_env(work / "home", f"sqlite:///{work / 'store.db'}")
    argv = [sys.executable, "-m", "backfill_assets.cli", bomb.command, str(path), "--json"]
    started = time.perf_counter()
    done, peak = run_peak(argv, env)
    wall = time.perf_counter() - started
    return peak, _outcome(bomb.command, done.returncode, done.stdout, done.stderr), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--field-mib", type=int, default=1024, help="the CSV field and gzip line")
    parser.add_argument("--line-mib", type=int, default=200, help="the gold line and field")
    parser.add_argument("--limits", action="store_true", help="also files near the limits")
    parser.add_argument(
        "--empty-rows", type=int, default=10_000_000, help="rows with no values in a Parquet file"
    )
    args = parser.parse_args()
    print(machine_speed())
    print(
        f"{'file':<34} {'size':>9} {'rows':>5} {'wall':>6} {'peak RSS':>9} {'normal':>9}  outcome"
    )
    for bomb in bombs(args.field_mib, args.line_mib, args.empty_rows):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            path = bomb.write(work)
            size = path.stat().st_size
            peak, outcome, wall = _measure(bomb, path, work / "bomb")
            path.unlink()
            normal, _, _ = _measure(bomb, bomb.normal(work), work / "normal")
        print(
            f"{bomb.name:<34} {size / 1024:>7,.0f} K {bomb.rows:>5} {wall:>5.1f}s {peak:>6,.0f} MB"
            f" {normal:>6,.0f} MB  {outcome}"
        )
    if args.limits:
        print(f"\n{'within the limits':<44} {'size':>9} {'peak RSS':>9}  outcome")
        for name, write in within_limits():
            with tempfile.TemporaryDirectory() as tmp:
                work = Path(tmp)
                path = write(work)
                size = path.stat().st_size
                peak, outcome, _ = _measure(Bomb(name, "import", 0, write, write), path, work)
            print(f"{name:<44} {size / 1024:>7,.0f} K {peak:>6,.0f} MB  {outcome}")


if __name__ == "__main__":
    main()
