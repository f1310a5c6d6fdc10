"""Core pipeline benchmark: throughput, no-op resume, memory, and the CLI's wall time.

    bench/run pipeline [--posts-per-tenant 10000] [--repeat 3] [--stores sqlite,pg]

Each measurement runs in a fresh process (peak RSS is per process) against a fresh store,
with the zero-latency fake model and no injected failures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import drop_store, fmt, machine_speed, median, new_store, worker

TENANTS = ["acme", "globex", "initech"]


def _work(mode: str, url: str, export: str, concurrency: int) -> None:
    """Worker process: import (not timed), then time the pipeline of one run."""
    from backfill_assets.config.variables import RunSettings
    from backfill_assets.dispatch.pipeline import PartitionRef, RunOptions, run_partitions
    from backfill_assets.domain.policy.rubric import TASK_VERSION, Rubric
    from backfill_assets.domain.work.keys import SLICE_COUNT, Versions
    from backfill_assets.ingest.importer import import_path
    from backfill_assets.ledger.engines import engine_for
    from backfill_assets.providers.models.fake import FakeModel

    engine = engine_for(url)
    if mode == "full":
        import_path(engine, Path(export))
    rubric = Rubric()
    versions = Versions(TASK_VERSION, rubric.key_version, "fake-moderator-1")
    refs = [PartitionRef(f"s{s:02d}|{t}", t, s) for t in TENANTS for s in range(SLICE_COUNT)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # The asset's first validation imports pandas and pandera (run_partitions does it before
    # its first call): timed on its own, so the rate below is the pipeline's, and the sum is
    # what the first run in a process costs.
    from backfill_assets.domain.policy.validation import warm_up

    t0 = time.perf_counter()
    warm_up(rubric.contract)
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    reports = run_partitions(
        engine,
        refs,
        FakeModel,
        versions,
        rubric,
        f"bench-{uuid.uuid4().hex[:6]}",
        RunOptions(run=RunSettings(concurrency=concurrency)),
    )
    elapsed = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fence_us, commits = _fence_cost(engine, refs) if mode == "full" else (0.0, 0)
    print(
        json.dumps(
            {
                "fence_us_per_commit": fence_us,
                "outcome_commits": commits,
                "posts": sum(r.posts for r in reports),
                "calls": sum(r.stats.calls for r in reports),
                "accepted": sum(r.stats.outcomes.get("accepted", 0) for r in reports),
                "seconds": elapsed,
                "warm_up_seconds": warm,
                "rss_before_mb": before / 1024,
                "peak_rss_mb": peak / 1024,
            }
        )
    )


def _fence_cost(engine: Any, refs: list[Any]) -> tuple[float, int]:
    """What the writer fence adds to each outcome commit, in us (median of 300), and how many
    outcome commits the run made (each stamps its events with one time).

    PostgreSQL: an otherwise empty fenced transaction is the check's query and nothing else
    (an empty transaction sends no statement). SQLite: the same minus an empty BEGIN
    IMMEDIATE/COMMIT, which every commit pays anyway; the rest is the lock files' stat calls.
    """
    import sqlalchemy as sa

    from backfill_assets.ledger.engine import is_sqlite, write_tx
    from backfill_assets.ledger.locks.writer_locks import WriterLocks

    def timed(tx: Any) -> float:
        samples = []
        for _ in range(300):
            t0 = time.perf_counter()
            with tx():
                pass
            samples.append((time.perf_counter() - t0) * 1e6)
        return sorted(samples)[len(samples) // 2]

    with engine.connect() as conn:
        commits = int(
            conn.execute(
                sa.text("SELECT count(DISTINCT at) FROM ledger_events WHERE type = 'usage'")
            ).scalar_one()
        )
    with WriterLocks(engine) as locks:
        for ref in refs:
            locks.acquire(ref.tenant_id, ref.slice)
        fenced = timed(locks.transaction)
    base = timed(lambda: write_tx(engine)) if is_sqlite(engine) else 0.0
    return max(0.0, fenced - base), commits


def _cli_run_wall(url: str, export: Path, workdir: Path) -> tuple[float, float, int]:
    env = {
        **os.environ,
        "BACKFILL_DATABASE_URL": url,
        "DAGSTER_HOME": str(workdir / f"dh-{uuid.uuid4().hex[:6]}"),
    }
    subprocess.run(
        [sys.executable, "-m", "backfill_assets.cli", "import", str(export)],
        env=env,
        check=True,
        capture_output=True,
    )
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "backfill_assets.cli", "run", "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    calls = json.loads(out.stdout.strip().splitlines()[-1])["totals"]["model_calls"]
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return wall, peak, calls


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--posts-per-tenant", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--stores", default="sqlite,pg")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--skip-cli", action="store_true", help="skip the whole-CLI wall time")
    p.add_argument("--worker", choices=["full", "noop"], help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--export", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        _work(a.worker, a.url, a.export, a.concurrency)
        return

    from backfill_assets.demo.generate import write_export

    n = a.posts_per_tenant * len(TENANTS)
    with tempfile.TemporaryDirectory(prefix="bf-bench-") as tmp:
        work = Path(tmp)
        export = work / "posts.jsonl"
        write_export(export, TENANTS, a.posts_per_tenant, bad_lines=False)
        print(
            f"# pipeline benchmark: {n:,} posts ({len(TENANTS)} tenants), zero-latency fake model, "
            f"concurrency {a.concurrency}, {a.repeat} repeat(s), {os.cpu_count()} cores"
        )
        print(machine_speed(), flush=True)
        figures: dict[str, float] = {}
        for kind in a.stores.split(","):
            rates, first, us_noop, peaks_full, peaks_noop, noop_calls = [], [], [], [], [], []
            fence_us, fence_share = [], []
            for _ in range(a.repeat):
                url = new_store(kind, work)
                try:
                    common = [
                        "--url",
                        url,
                        "--export",
                        str(export),
                        "--concurrency",
                        str(a.concurrency),
                    ]
                    full = worker("bench.pipeline_bench", ["--worker", "full", *common])
                    noop = worker("bench.pipeline_bench", ["--worker", "noop", *common])
                finally:
                    drop_store(url)
                assert full["accepted"] == n, full
                rates.append(full["calls"] / full["seconds"])
                fence_us.append(full["fence_us_per_commit"])
                spent = full["fence_us_per_commit"] * full["outcome_commits"] / 1e6
                fence_share.append(100 * spent / full["seconds"])
                first.append(full["calls"] / (full["seconds"] + full["warm_up_seconds"]))
                us_noop.append(noop["seconds"] / n * 1e6)
                noop_calls.append(noop["calls"])
                peaks_full.append(full["peak_rss_mb"])
                peaks_noop.append(noop["peak_rss_mb"] - noop["rss_before_mb"])
            print(f"[{kind}] full run, pipeline inside the asset: {fmt(rates, 'items/s')}")
            print(
                f"[{kind}] the same counting the process's first-use load of pandas/pandera: "
                f"{fmt(first, 'items/s')}"
            )
            print(
                f"[{kind}] no-op resume: {fmt(us_noop, 'us/item', 2)}; model calls {max(noop_calls)}"
            )
            print(
                f"[{kind}] writer fence (lock check inside each outcome commit): "
                f"{fmt(fence_us, 'us/commit', 0)}, {fmt(fence_share, '% of the run', 2)}"
            )
            print(
                f"[{kind}] peak RSS, full run process: {fmt(peaks_full, 'MB')}; "
                f"no-op resume growth over start-up: {fmt(peaks_noop, 'MB', 1)}"
            )
            figures |= {
                f"{kind}_items_s": median(rates),
                f"{kind}_items_s_with_first_load": median(first),
                f"{kind}_noop_us_per_item": median(us_noop),
                f"{kind}_fence_us_per_commit": median(fence_us),
                f"{kind}_fence_share_pct": median(fence_share),
            }
        if not a.skip_cli:
            url = new_store("sqlite", work)
            wall, peak, calls = _cli_run_wall(url, export, work)
            print(
                f"[sqlite] whole `backfill-moderation run` (Dagster start-up, 3 in-process runs, "
                f"{calls:,} calls): {wall:.1f} s wall, peak RSS {peak:.0f} MB"
            )
            figures["cli_run_wall_s"] = wall
        # The last line: the medians as JSON (what `bench/run ab` compares).
        print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
