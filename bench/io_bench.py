"""Data in and out at scale: import from Parquet and from a PostgreSQL table against the JSONL
import of the same posts (wall and peak RSS of each command, in its own process), then the
export of every label to Parquet and their write-back into a PostgreSQL sink.

    bench/run io [--posts 1000000] [--tenants 200] [--no-export]
    bench/run io --incremental [--posts 1000000] [--repeat 5] [--boundaries 1,1000,10000]

The store is PostgreSQL (a fresh database per import, so each starts from empty), and so is
the source table. Figures: wall seconds, CPU seconds and peak RSS of the ``import`` command,
and each format's wall against JSONL's. Targets: no slower than JSONL, peak RSS <= 1.5 GiB.
The export step labels the JSONL store with ``run`` (the fake model) and times ``export
--format parquet`` of every label (target for the export: peak RSS <= 1.5 GiB, bounded by its
batch, not by the labels), then ``sink write`` of every applied label into a fresh PostgreSQL
database (target: at least 20,000 rows/s). ``uptime`` is printed first: the machine is shared.

``--incremental`` measures what an incremental import with nothing new costs when it reads
the mark's cursor value again: a PostgreSQL source of ``--posts`` rows, one ``updated_at``
second each (indexed), imported once with ``--cursor updated_at``; then, for each boundary
size B, the last B rows are stamped with the newest value (one import settles them) and
``--repeat`` imports with nothing new are timed, each re-reading those B rows. Figures: the
median wall and CPU of the ``import`` command and what it read (all unchanged).
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa

from bench.common import drop_store, machine_speed, median, new_store
from bench.scale_bench import Measured, cli, cli_env, records, write_export

PREFIX = "bf_bench_io_"
RSS_TARGET_MB = 1536
_CHUNK = 100_000
# The source's import: incremental by updated_at.
SQL_IMPORT = [
    "--source",
    "app",
    "--cursor",
    "updated_at",
    "--query",
    "SELECT workspace, id, body, updated_at FROM app_posts",
    "--map",
    "tenant_id=workspace,post_id=id,text=body",
]


def write_parquet(path: Path, posts: int, tenants: int) -> Path:
    """The same records as ``write_export``, as Parquet (row groups of 100,000)."""
    names = ("tenant_id", "post_id", "text")
    schema = pa.schema([(n, pa.string()) for n in names])
    with pq.ParquetWriter(path, schema) as writer:
        chunk: list[dict[str, str]] = []
        for rec in records(posts, tenants):
            chunk.append(rec)
            if len(chunk) >= _CHUNK:
                writer.write_table(
                    pa.table({n: [r[n] for r in chunk] for n in names}, schema=schema)
                )
                chunk = []
        if chunk:
            writer.write_table(pa.table({n: [r[n] for r in chunk] for n in names}, schema=schema))
    return path


def load_source(url: str, posts: int, tenants: int, distinct: bool = False) -> None:
    """The same records in a table of a PostgreSQL database, by COPY; all at one
    ``updated_at``, or (``distinct``) one second apart."""
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE app_posts (workspace text, id text, body text, updated_at timestamptz)"
        )
        raw = conn.connection.driver_connection
        assert raw is not None
        cur = raw.cursor()
        buf = io.StringIO()
        for n, rec in enumerate(records(posts, tenants), start=1):
            at = (start + dt.timedelta(seconds=n)).isoformat() if distinct else "2026-01-01"
            buf.write(f"{rec['tenant_id']}\t{rec['post_id']}\t{rec['text']}\t{at}\n")
            if n % _CHUNK == 0:
                buf.seek(0)
                cur.copy_expert("COPY app_posts FROM STDIN", buf)
                buf = io.StringIO()
        buf.seek(0)
        cur.copy_expert("COPY app_posts FROM STDIN", buf)
    engine.dispose()


def _import(work: Path, name: str, args: list[str], export: bool = False) -> Measured:
    store = new_store("pg", work, prefix=PREFIX)
    try:
        env = cli_env(work / f"home-{name}", store)
        got = cli(["import", *args], env)
        print(
            f"[import {name}] {got.wall:.1f} s wall, {got.cpu:.1f} s CPU, peak RSS "
            f"{got.rss_mb:,.0f} MB, imported {got.doc.get('imported', 0):,}",
            flush=True,
        )
        if export:
            _EXPORTS.append(_export(work, env))
        return got
    finally:
        drop_store(store)


_EXPORTS: list[Measured] = []
SINK_TARGET_ROWS_S = 20_000


def _export(work: Path, env: dict[str, str]) -> Measured:
    """Label everything, then export every label to Parquet."""
    ran = cli(["run"], env)
    print(f"[run] {ran.wall:.1f} s wall, peak RSS {ran.rss_mb:,.0f} MB", flush=True)
    got = cli(["export", "--format", "parquet", "--out", str(work / "labels")], env)
    rows = sum(int(f["rows"]) for f in got.doc.get("files", []))
    print(
        f"[export parquet] {rows:,} labels in {len(got.doc.get('files', []))} files: "
        f"{got.wall:.1f} s wall ({rows / got.wall:,.0f} labels/s), peak RSS {got.rss_mb:,.0f} MB",
        flush=True,
    )
    _SINKS.append(_sink_write(work, env))
    return got


_SINKS: list[Measured] = []


def _sink_write(work: Path, env: dict[str, str]) -> Measured:
    """Every applied label into a fresh PostgreSQL sink (its table from ``sink ddl``)."""
    sink = new_store("pg", work, prefix=PREFIX + "sink_")
    try:
        env = {**env, "BACKFILL_SINK_URL": sink}
        engine = sa.create_engine(sink)
        with engine.begin() as conn:
            conn.exec_driver_sql(cli(["sink", "ddl"], env).doc["ddl"])
        engine.dispose()
        got = cli(["sink", "write"], env)
        rows = int(got.doc.get("rows", 0))
        print(
            f"[sink write] {rows:,} rows in {got.doc.get('partitions', 0):,} partitions: "
            f"{got.wall:.1f} s wall ({rows / got.wall:,.0f} rows/s with start-up, "
            f"{got.doc.get('rows_per_s', 0):,} rows/s writing), peak RSS {got.rss_mb:,.0f} MB",
            flush=True,
        )
        return got
    finally:
        drop_store(sink)


def io_bench(posts: int, tenants: int, export: bool = True) -> dict[str, Any]:
    """Import the same posts from JSONL, Parquet and a PostgreSQL table."""
    print("# uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(machine_speed())
    print(f"# io: {posts:,} posts over {tenants} tenants, store PostgreSQL", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-io-") as tmp:
        work = Path(tmp)
        jsonl = write_export(work / "posts.jsonl", posts, tenants)
        parquet = write_parquet(work / "posts.parquet", posts, tenants)
        source = new_store("pg", work, prefix=PREFIX)
        try:
            load_source(source, posts, tenants)
            steps = {
                "jsonl": _import(work, "jsonl", [str(jsonl)], export=export),
                "parquet": _import(work, "parquet", [str(parquet)]),
                "postgresql table": _import(
                    work,
                    "postgresql table",
                    ["--sql", source, *SQL_IMPORT],
                ),
            }
        finally:
            drop_store(source)
    base = steps["jsonl"].wall
    for name, m in steps.items():
        ok = m.wall <= base * 1.05 and m.rss_mb <= RSS_TARGET_MB
        print(
            f"{name:>17}: {m.wall:7.1f} s ({m.wall / base:.2f}x JSONL), peak RSS "
            f"{m.rss_mb:,.0f} MB{'' if ok else '  (target missed)'}"
        )
    doc = {k: {"wall_s": m.wall, "cpu_s": m.cpu, "rss_mb": m.rss_mb} for k, m in steps.items()}
    for m in _EXPORTS:
        ok = m.rss_mb <= RSS_TARGET_MB
        print(
            f"  export parquet: {m.wall:7.1f} s, peak RSS {m.rss_mb:,.0f} MB{'' if ok else '  (target missed)'}"
        )
        doc["export parquet"] = {"wall_s": m.wall, "cpu_s": m.cpu, "rss_mb": m.rss_mb}
    for m in _SINKS:
        rate = int(m.doc.get("rows_per_s", 0))
        ok = rate >= SINK_TARGET_ROWS_S and m.rss_mb <= RSS_TARGET_MB
        print(
            f"      sink write: {m.wall:7.1f} s, {rate:,} rows/s, peak RSS {m.rss_mb:,.0f} MB"
            f"{'' if ok else '  (target missed)'}"
        )
        doc["sink write"] = {"wall_s": m.wall, "rows_per_s": rate, "rss_mb": m.rss_mb}
    print(json.dumps(doc, sort_keys=True))
    return doc


def _stamp_newest(source: str, rows: int) -> None:
    """Give the ``rows`` newest rows the newest ``updated_at``: one cursor value of that many."""
    engine = sa.create_engine(source)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE app_posts SET updated_at = (SELECT max(updated_at) FROM app_posts) WHERE id IN"
            f" (SELECT id FROM app_posts ORDER BY updated_at DESC LIMIT {int(rows)})"
        )
    engine.dispose()


def incremental_bench(
    posts: int, tenants: int, repeat: int, boundaries: list[int]
) -> dict[str, Any]:
    """An incremental import with nothing new, re-reading boundaries of each size."""
    print("# uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(machine_speed())
    print(f"# io --incremental: a {posts:,}-row PostgreSQL source, store PostgreSQL", flush=True)
    doc: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-io-") as tmp:
        work = Path(tmp)
        source = new_store("pg", work, prefix=PREFIX)
        store = new_store("pg", work, prefix=PREFIX)
        try:
            load_source(source, posts, tenants, distinct=True)
            engine = sa.create_engine(source)
            with engine.begin() as conn:
                conn.exec_driver_sql("CREATE INDEX app_posts_updated_at ON app_posts (updated_at)")
                conn.exec_driver_sql("ANALYZE app_posts")
            engine.dispose()
            env = cli_env(work / "home", store)
            args = ["import", "--sql", source, *SQL_IMPORT]
            full = cli(args, env)
            print(
                f"[full import] {full.wall:.1f} s wall, {full.cpu:.1f} s CPU, "
                f"imported {full.doc.get('imported', 0):,}",
                flush=True,
            )
            doc["full"] = {"wall_s": full.wall, "cpu_s": full.cpu}
            for rows in boundaries:
                _stamp_newest(source, rows)
                cli(args, env)  # reads the restamped rows once (unchanged) and settles the mark
                runs = [cli(args, env) for _ in range(repeat)]
                wall, cpu = median([m.wall for m in runs]), median([m.cpu for m in runs])
                read = int(runs[-1].doc.get("read", 0))
                unchanged = int(runs[-1].doc.get("unchanged", 0))
                print(
                    f"[nothing new, {rows:,} rows at the mark's value] median {wall:.2f} s wall, "
                    f"{cpu:.2f} s CPU ({repeat} runs); read {read:,}, unchanged {unchanged:,}",
                    flush=True,
                )
                doc[f"boundary {rows}"] = {"wall_s": wall, "cpu_s": cpu, "read": read}
        finally:
            drop_store(store)
            drop_store(source)
    print(json.dumps(doc, sort_keys=True))
    return doc


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/run io", description=__doc__.splitlines()[0])
    p.add_argument("--posts", type=int, default=1_000_000)
    p.add_argument("--tenants", type=int, default=200)
    p.add_argument("--no-export", action="store_true", help="skip labelling and the export")
    p.add_argument(
        "--incremental",
        action="store_true",
        help="only: incremental imports with nothing new, re-reading the mark's cursor value",
    )
    p.add_argument("--repeat", type=int, default=5, help="with --incremental: timed imports")
    p.add_argument(
        "--boundaries",
        default="1,1000,10000",
        help="with --incremental: rows at the mark's cursor value, comma-separated",
    )
    a = p.parse_args()
    if a.incremental:
        sizes = [int(x) for x in a.boundaries.split(",")]
        incremental_bench(a.posts, a.tenants, a.repeat, sizes)
    else:
        io_bench(a.posts, a.tenants, export=not a.no_export)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
