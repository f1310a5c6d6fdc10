"""One provider limit shared by concurrent runs in separate processes.

    bench/run shared-limit [--runs 4] [--posts-per-run 600] [--rpm 1200] [--latency-ms 200]
                           [--concurrency 64] [--store sqlite|pg] [--modes shared,unshared]
    bench/run shared-limit --fair [--big 3000] [--small 100] [--small-after 10]

Default: ``--runs`` processes start at once, each running the real pipeline (dispatcher,
writer, HTTP adapter, limiter) for its own tenant against one simulator limited to ``--rpm``,
all told that same limit. ``shared`` is the default (the processes divide the limit through
the store); ``unshared`` (``BACKFILL_SHARE_LIMIT=0``) is each process believing it has the
whole limit, as before. Figures from the simulator's meter: admitted requests per minute in
the steady window (after 5 s, before the last 5 s) over the limit, and 429s over all requests.

``--fair``: a big tenant runs alone; ``--small-after`` seconds later a small tenant starts in
another process. Its fair-share time is small / (limit / active tenants); the figure is its
wall time over that (target: at most 2x).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.common import ROOT, drop_store, new_store

MODEL = "gpt-4o-mini"
WARMUP_S = 5.0
TAIL_S = 5.0


def _worker(args: argparse.Namespace) -> None:
    """One run in this process: every partition of ``--tenant`` through the HTTP adapter."""
    from backfill_assets.config.variables import HttpSettings, ModelSettings, RunSettings
    from backfill_assets.defs.model_resources import OpenAIModelResource
    from backfill_assets.dispatch.pipeline import PartitionRef, RunOptions, run_partitions
    from backfill_assets.domain.policy.rubric import TASK_VERSION, Rubric
    from backfill_assets.domain.work.keys import SLICE_COUNT, Versions
    from backfill_assets.domain.work.outcomes import RetryPolicy
    from backfill_assets.ledger.engines import engine_for

    engine = engine_for(args.url)
    resource = OpenAIModelResource(
        ModelSettings(model=MODEL, model_base_url=args.base),
        HttpSettings(rpm=args.rpm, tpm=0, share_limit=args.share == 1),
    )
    rubric = Rubric()
    versions = Versions(TASK_VERSION, rubric.key_version, MODEL)
    refs = [PartitionRef(f"s{s:02d}|{args.tenant}", args.tenant, s) for s in range(SLICE_COUNT)]
    t0 = time.monotonic()
    reports = run_partitions(
        engine,
        refs,
        resource.build_adapter,
        versions,
        rubric,
        f"bench-{uuid.uuid4().hex[:6]}",
        RunOptions(
            run=RunSettings(concurrency=args.concurrency),
            retry=RetryPolicy(
                max_attempts=20,
                retry_base_seconds=0.5,
                retry_max_seconds=30.0,
                retry_after_max_seconds=900.0,
            ),
        ),
    )
    doc = {
        "tenant": args.tenant,
        "wall_s": round(time.monotonic() - t0, 2),
        "accepted": sum(r.stats.outcomes.get("accepted", 0) for r in reports),
        "rate_limited": sum(r.stats.rate_limited for r in reports),
    }
    print(json.dumps(doc), flush=True)


def _start_sim(rpm: int, latency_ms: float) -> tuple[subprocess.Popen[str], str]:
    cmd = [
        sys.executable,
        "-m",
        "backfill_assets.cli",
        "provider-sim",
        "--port",
        "0",
        "--rpm",
        str(rpm),
        "--tpm",
        "100000000",
        "--latency-ms",
        str(latency_ms),
        "--latency-sigma",
        "0.3",
        "--seed",
        "11",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    prefix = "provider-sim listening on "
    if not line.startswith(prefix):
        proc.kill()
        raise RuntimeError(f"simulator did not start: {line!r}")
    return proc, line.removeprefix(prefix)


def _import(url: str, counts: dict[str, int], work: Path) -> None:
    from backfill_assets.ingest.importer import import_path
    from backfill_assets.ledger.engines import engine_for

    path = work / f"posts-{uuid.uuid4().hex[:6]}.jsonl"
    with path.open("w") as fh:
        for tenant, n in counts.items():
            for i in range(n):
                text = f"{tenant} post {i}: arrived on time, works as described"
                fh.write(json.dumps({"tenant_id": tenant, "post_id": f"p{i}", "text": text}))
                fh.write("\n")
    import_path(engine_for(url), path)


def _spawn(args: argparse.Namespace, url: str, base: str, tenant: str, share: bool) -> Any:
    cmd = [
        sys.executable,
        "-m",
        "bench.shared_limit_bench",
        "--worker",
        "--url",
        url,
        "--base",
        base,
        "--tenant",
        tenant,
        "--rpm",
        str(args.rpm),
        "--concurrency",
        str(args.concurrency),
        "--share",
        "1" if share else "0",
    ]
    return subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE, text=True)


def _meter(base: str) -> dict[str, Any]:
    root = base.removesuffix("/v1")
    doc: dict[str, Any] = httpx.get(f"{root}/_sim/meter", timeout=30).json()
    return doc


def _steady_rpm(stamps: list[float]) -> float:
    stamps = sorted(stamps)
    start, end = stamps[0] + WARMUP_S, stamps[-1] - TAIL_S
    steady = sum(1 for t in stamps if start <= t < end)
    return steady / max(1e-9, end - start) * 60.0


def _together(args: argparse.Namespace, share: bool, work: Path) -> dict[str, Any]:
    url = new_store(args.store, work)
    tenants = [f"run-{i}" for i in range(args.runs)]
    _import(url, dict.fromkeys(tenants, args.posts_per_run), work)
    sim, base = _start_sim(args.rpm, args.latency_ms)
    try:
        t0 = time.monotonic()
        procs = [_spawn(args, url, base, t, share) for t in tenants]
        docs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
        wall = time.monotonic() - t0
        meter = _meter(base)
    finally:
        sim.terminate()
        drop_store(url)
    requests = int(meter["requests_total"])
    refused = int(meter["responses_by_status"].get("429", 0))
    stamps = sorted(meter["timestamps"])
    rpm = _steady_rpm(stamps)
    # Admitted requests per 10 s, to see ramp-up and tail (the limit is rpm/6 per bucket).
    timeline = [0] * (int((stamps[-1] - stamps[0]) // 10) + 1)
    for t in stamps:
        timeline[int((t - stamps[0]) // 10)] += 1
    return {
        "mode": "shared" if share else "unshared",
        "runs": args.runs,
        "posts": args.runs * args.posts_per_run,
        "accepted": sum(d["accepted"] for d in docs),
        "wall_s": round(wall, 1),
        "admitted_rpm": round(rpm, 1),
        "share_of_limit": round(rpm / args.rpm, 4),
        "requests": requests,
        "share_429": round(refused / max(1, requests), 5),
        "per_10s": timeline,
    }


def _fair(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    url = new_store(args.store, work)
    _import(url, {"big": args.big, "small": args.small}, work)
    sim, base = _start_sim(args.rpm, args.latency_ms)
    try:
        big = _spawn(args, url, base, "big", True)
        time.sleep(args.small_after)
        small = _spawn(args, url, base, "small", True)
        small_doc = json.loads(small.communicate()[0].strip().splitlines()[-1])
        big_doc = json.loads(big.communicate()[0].strip().splitlines()[-1])
        meter = _meter(base)
    finally:
        sim.terminate()
        drop_store(url)
    fair_s = args.small / (args.rpm / 2) * 60.0
    requests = int(meter["requests_total"])
    return {
        "mode": "fair-share",
        "big_posts": args.big,
        "small_posts": args.small,
        "small_wall_s": small_doc["wall_s"],
        "fair_share_s": round(fair_s, 1),
        "small_over_fair": round(small_doc["wall_s"] / fair_s, 2),
        "big_wall_s": big_doc["wall_s"],
        "share_429": round(int(meter["responses_by_status"].get("429", 0)) / max(1, requests), 5),
    }


def main() -> None:
    """Parse arguments; run the worker or the benchmark."""
    p = argparse.ArgumentParser(prog="bench/run shared-limit")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--base", help=argparse.SUPPRESS)
    p.add_argument("--tenant", help=argparse.SUPPRESS)
    p.add_argument("--share", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--posts-per-run", type=int, default=600)
    p.add_argument("--rpm", type=int, default=1200)
    p.add_argument("--latency-ms", type=float, default=200.0)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--store", choices=["sqlite", "pg"], default="sqlite")
    p.add_argument("--modes", default="unshared,shared")
    p.add_argument("--fair", action="store_true", help="big tenant, then a small one")
    p.add_argument("--big", type=int, default=3000)
    p.add_argument("--small", type=int, default=100)
    p.add_argument("--small-after", type=float, default=10.0)
    args = p.parse_args()
    if args.worker:
        _worker(args)
        return
    with tempfile.TemporaryDirectory(prefix="bench-shared-") as tmp:
        work = Path(tmp)
        if args.fair:
            print(json.dumps(_fair(args, work)), flush=True)
            return
        for mode in args.modes.split(","):
            print(json.dumps(_together(args, mode == "shared", work)), flush=True)


if __name__ == "__main__":
    main()
