"""Ten million posts on PostgreSQL, whole CLI, zero-latency fake model (issue 51, item 1).

    bench/run scale --ten-million [--posts 10000000] [--tenants 2000] [--concurrency 64]
                                  [--files 10] [--ui-queries 3]

``posts`` posts over ``tenants`` tenants of mixed sizes, deterministic and scaled with the post
count: 3 tenants share 30% (0.8, 1 and 1.2 million at 10M), 1.5% of the tenants (30 of 2,000)
share 64% (about 213,000 each at 10M) and the rest share 6% (about 300 each at 10M), sizes
within a class varying by up to 20% either way. The posts are written as
JSONL files (``--files`` of them, streamed to disk, never held in memory), then every command is
the whole CLI in its own process, fresh ``DAGSTER_HOME``, a temporary PostgreSQL store and a
temporary PostgreSQL Dagster instance, with wall time and peak RSS:

- ``import`` (the directory), ``run``, a no-op ``run``, ``verify --require-complete``;
- ``export --format parquet``;
- the write-back: ``sink write`` into ``BACKFILL_SINK_URL``, a third temporary database holding
  the table ``sink ddl`` prints (every applied label, as a run with the sink set writes them);
- ``usage --totals``;
- the UI's partitions page: ``dagster-webserver`` on the same home, and the GraphQL query of
  moderation_labels' partition keys and partition statuses (the data that page loads), timed
  first after start and then warm (median of ``--ui-queries``).

Then the disk per post: ``pg_database_size`` of the store and of the Dagster instance over the
post count. Compare the per-post figures of two sizes to see what grows faster than linearly.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from bench.common import ROOT, drop_store, machine_speed, median, new_store
from bench.scale_bench import (
    _TEXTS,
    PREFIX,
    Measured,
    _pg_instance,
    _tmp_root,
    calls_of,
    cli,
    cli_env,
    processes_of,
)

# (share of the tenants, share of the posts) of each size class; the first is a tenant count.
_BIG_TENANTS = 3
_BIG_SHARE = 0.30
_MEDIUM_TENANTS = 0.015
_MEDIUM_SHARE = 0.64

_UI_QUERY = """
query Partitions($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    __typename
    ... on AssetNode {
      partitionKeys
      assetPartitionStatuses {
        __typename
        ... on DefaultPartitionStatuses {
          materializedPartitions
          materializingPartitions
          failedPartitions
        }
        ... on MultiPartitionStatuses {
          primaryDimensionName
          ranges {
            primaryDimStartKey
            primaryDimEndKey
            secondaryDim {
              __typename
              ... on DefaultPartitionStatuses {
                materializedPartitions
                materializingPartitions
                failedPartitions
              }
            }
          }
        }
      }
    }
  }
}
"""


def tenant_sizes(posts: int, tenants: int) -> list[int]:
    """Posts a tenant, deterministic, summing to ``posts``: 3 big tenants of 10% each, a few
    medium ones sharing 64%, the rest sharing 6%; within a class sizes vary by up to +-20%."""
    big = min(_BIG_TENANTS, tenants)
    medium = max(1, round(tenants * _MEDIUM_TENANTS))
    small = max(0, tenants - big - medium)
    weights: list[float] = []
    for count, share in (
        (big, _BIG_SHARE),
        (medium, _MEDIUM_SHARE),
        (small, 1 - _BIG_SHARE - _MEDIUM_SHARE),
    ):
        jitter = [1 + ((i * 7) % 5 - 2) / 10 for i in range(count)]
        total = sum(jitter) or 1
        weights += [share * j / total for j in jitter]
    sizes = [max(1, int(posts * w)) for w in weights]
    sizes[0] += posts - sum(sizes)  # the rounding goes to the biggest tenant
    return sizes


def tenant_name(i: int) -> str:
    """``t0000``.."""
    return f"t{i:04d}"


def records(posts: int, tenants: int) -> Iterator[dict[str, str]]:
    """Every post, tenant by tenant."""
    n = 0
    for t, size in enumerate(tenant_sizes(posts, tenants)):
        name = tenant_name(t)
        for _ in range(size):
            yield {
                "tenant_id": name,
                "post_id": f"p{n:09d}",
                "text": f"{_TEXTS[n % len(_TEXTS)]} (#{n})",
            }
            n += 1


def write_exports(folder: Path, posts: int, tenants: int, files: int) -> tuple[Path, int]:
    """JSONL files of ``records`` in ``folder``, streamed; the folder and its bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    per_file = -(-posts // max(1, files))
    fh = None
    size = 0
    try:
        for i, rec in enumerate(records(posts, tenants)):
            if i % per_file == 0:
                if fh is not None:
                    fh.close()
                fh = (folder / f"posts-{i // per_file:03d}.jsonl").open("w", encoding="utf-8")
            line = json.dumps(rec, ensure_ascii=False) + "\n"
            size += len(line.encode())
            fh.write(line)
    finally:
        if fh is not None:
            fh.close()
    return folder, size


def db_size(url: str) -> int:
    """``pg_database_size`` of the database of ``url``, in bytes."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(sa.text("SELECT pg_database_size(current_database())")).scalar_one()
            )
    finally:
        engine.dispose()


def _count(url: str, table: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())
    finally:
        engine.dispose()


def make_sink(env: dict[str, str], sink_url: str) -> None:
    """The table ``sink ddl`` prints, created in ``sink_url``."""
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "-m", "backfill_assets.cli", "sink", "ddl"],
        cwd=ROOT,
        env={**env, "BACKFILL_SINK_URL": sink_url},
        capture_output=True,
        text=True,
        check=True,
    )
    ddl = done.stdout.replace("\\t", " ")
    engine = sa.create_engine(sink_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(ddl))
    finally:
        engine.dispose()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def ui_partitions(env: dict[str, str], work: Path, queries: int) -> dict[str, Any]:
    """Start ``dagster-webserver`` on the home of ``env``; time the partitions query."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = work / "webserver.log"
    variables = {"assetKey": {"path": ["moderation_labels"]}}
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [
                str(ROOT / ".venv" / "bin" / "dagster-webserver"),
                *("-w", str(ROOT / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)),
            ],
            cwd=ROOT,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        t0 = time.perf_counter()
        ready = None
        while ready is None:
            if proc.poll() is not None or time.perf_counter() - t0 > 300:
                raise RuntimeError(log.read_text()[-3000:])
            with suppress(httpx.HTTPError, KeyError, TypeError):
                doc = httpx.post(
                    f"{base}/graphql",
                    json={"query": "{ version }"},
                    timeout=10,
                ).json()
                if doc["data"]["version"]:
                    ready = time.perf_counter() - t0
            time.sleep(0.25)
        times: list[float] = []
        node: dict[str, Any] = {}
        for _ in range(1 + max(1, queries)):
            t0 = time.perf_counter()
            doc = httpx.post(
                f"{base}/graphql",
                json={"query": _UI_QUERY, "variables": variables},
                timeout=600,
            ).json()
            times.append(time.perf_counter() - t0)
            if doc.get("errors"):
                raise RuntimeError(json.dumps(doc["errors"])[:3000])
            node = doc["data"]["assetNodeOrError"]
        rss = _rss_mb(proc.pid)
    finally:
        proc.terminate()
        with suppress(subprocess.TimeoutExpired):
            proc.wait(15)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    statuses = node.get("assetPartitionStatuses") or {}
    return {
        "ready_s": ready,
        "first_s": times[0],
        "warm_s": median(times[1:]),
        "partitions": len(node.get("partitionKeys") or []),
        "statuses": statuses.get("__typename"),
        "rss_mb": rss,
    }


def _rss_mb(pid: int) -> float:
    """Resident memory now of ``pid`` and its children (the webserver's code server), MiB."""
    total = 0
    pids = [pid]
    with suppress(OSError, ValueError):
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(c) for c in children]
    for p in pids:
        with suppress(OSError, ValueError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
    return total / 1024


def _line(name: str, m: Measured, posts: int, extra: str = "") -> None:
    print(
        f"[{name}] {m.wall:,.1f} s wall ({m.wall / posts * 1e6:,.1f} us/post), {m.cpu:,.1f} s "
        f"CPU, peak RSS {m.rss_mb:,.0f} MB{extra}",
        flush=True,
    )


def ten_million(
    posts: int, tenants: int, concurrency: int, files: int, queries: int
) -> dict[str, Any]:
    """Every figure of issue 51's item 1 at ``posts`` posts."""
    sizes = tenant_sizes(posts, tenants)
    print(
        f"# ten-million: {posts:,} posts over {tenants:,} tenants (largest {max(sizes):,}, "
        f"median {int(median(sizes)):,}, smallest {min(sizes):,}); PostgreSQL store, instance "
        f"and sink; zero-latency fake model, concurrency {concurrency}",
        flush=True,
    )
    dropped: list[str] = []
    steps: dict[str, Measured] = {}
    out: dict[str, Any] = {"posts": posts, "tenants": tenants}
    with tempfile.TemporaryDirectory(prefix="scale-ten-million-", dir=_tmp_root()) as tmp:
        work = Path(tmp)
        try:
            t0 = time.perf_counter()
            folder, jsonl_bytes = write_exports(work / "exports", posts, tenants, files)
            print(
                f"[generate] {time.perf_counter() - t0:,.1f} s, {jsonl_bytes / 2**20:,.0f} MiB of "
                f"JSONL in {len(list(folder.iterdir()))} files",
                flush=True,
            )
            home = work / "home"
            extra, instance_url = _pg_instance(home)
            dropped.append(instance_url)
            store_url = new_store("pg", work, prefix=PREFIX)
            dropped.append(store_url)
            sink_url = new_store("pg", work, prefix=PREFIX)
            dropped.append(sink_url)
            env = cli_env(home, store_url, BACKFILL_CONCURRENCY=str(concurrency), **extra)

            steps["import"] = cli(["import", str(folder)], env)
            _line(
                "import", steps["import"], posts, f", {posts / steps['import'].wall:,.0f} posts/s"
            )
            steps["run"] = cli(["run"], env)
            calls = calls_of(steps["run"])
            _line(
                "run",
                steps["run"],
                posts,
                f", {calls:,} model calls, {calls / steps['run'].wall:,.0f} posts/s, "
                f"{processes_of(steps['run'])} process(es), {len(steps['run'].doc.get('runs', []))} "
                "Dagster run(s)",
            )
            steps["no-op run"] = cli(["run"], env)
            _line("no-op run", steps["no-op run"], posts, f", {calls_of(steps['no-op run'])} calls")
            steps["verify"] = cli(["verify", "--require-complete"], env)
            _line(
                "verify --require-complete",
                steps["verify"],
                posts,
                f", ok={steps['verify'].doc.get('ok')}",
            )
            steps["export"] = cli(
                ["export", "--format", "parquet", "--out", str(work / "out")], env
            )
            parquet = sum(p.stat().st_size for p in (work / "out").rglob("*.parquet"))
            _line(
                "export --format parquet",
                steps["export"],
                posts,
                f", {parquet / 2**20:,.0f} MiB of Parquet",
            )
            make_sink(env, sink_url)
            sink_env = {**env, "BACKFILL_SINK_URL": sink_url}
            steps["sink write"] = cli(["sink", "write"], sink_env)
            written = _count(sink_url, "moderation_labels")
            _line(
                "write-back (sink write)",
                steps["sink write"],
                posts,
                f", {written:,} rows in the sink, {written / steps['sink write'].wall:,.0f} rows/s",
            )
            steps["usage"] = cli(["usage", "--totals"], env)
            _line("usage --totals", steps["usage"], posts)
            ui = ui_partitions(env, work, queries)
            print(
                f"[UI partitions page, GraphQL] webserver ready {ui['ready_s']:.1f} s; query of "
                f"{ui['partitions']:,} partitions' statuses ({ui['statuses']}): first "
                f"{ui['first_s']:.2f} s, warm {ui['warm_s']:.2f} s (median of {queries}); "
                f"webserver + code server peak RSS {ui['rss_mb']:,.0f} MB",
                flush=True,
            )
            store_bytes = db_size(store_url)
            instance_bytes = db_size(instance_url)
            out["disk"] = {
                "jsonl_b_post": jsonl_bytes / posts,
                "store_b_post": store_bytes / posts,
                "instance_b_post": instance_bytes / posts,
                "store_mb": store_bytes / 2**20,
                "instance_mb": instance_bytes / 2**20,
                "sink_b_post": db_size(sink_url) / posts,
            }
            print(
                f"[disk] store {store_bytes / 2**20:,.0f} MiB = {store_bytes / posts:,.0f} B/post; "
                f"Dagster instance {instance_bytes / 2**20:,.0f} MiB = "
                f"{instance_bytes / posts:,.1f} B/post; sink {out['disk']['sink_b_post']:,.0f} "
                f"B/post; JSONL {jsonl_bytes / posts:,.0f} B/post",
                flush=True,
            )
            out["ui"] = ui
        finally:
            for url in dropped:
                drop_store(url)
    peak = max(m.rss_mb for m in steps.values())
    print(f"peak RSS over all commands: {peak:,.0f} MB at {posts:,} posts", flush=True)
    out["steps"] = {
        k: {"wall_s": m.wall, "cpu_s": m.cpu, "rss_mb": m.rss_mb, "us_post": m.wall / posts * 1e6}
        for k, m in steps.items()
    }
    out["ok"] = steps["verify"].doc.get("ok")
    return out


def main() -> None:
    """Parse, run, print the figures; the last line is them as JSON."""
    p = argparse.ArgumentParser(
        prog="bench/run scale --ten-million",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--posts", type=int, default=10_000_000)
    p.add_argument("--tenants", type=int, default=2_000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--files", type=int, default=10, help="JSONL files the posts are written to")
    p.add_argument("--ui-queries", type=int, default=3, help="warm partitions queries")
    a = p.parse_args()
    print(machine_speed(), flush=True)
    doc = ten_million(a.posts, a.tenants, a.concurrency, a.files, a.ui_queries)
    print(json.dumps(doc, default=str), flush=True)


if __name__ == "__main__":
    main()
