"""Provider utilisation across tenants: one backfill of many tenants through the
whole CLI against the simulator, measured over the whole backfill.

    bench/run utilization [--tenants 10] [--posts 1500] [--rpm 600] [--latency-ms 200]
                          [--concurrency 64]

``backfill-moderation run`` plans the tenants' partitions and pools them into few Dagster runs,
so the provider sees one continuous stream instead of a gap between tenants. The figures come
from the simulator's meter: requests admitted per minute between the first and the last
admitted request over the limit (target >= 99%), and 429s over all requests (target <= 0.2%).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import ROOT, clean_env
from bench.shared_limit_bench import _start_sim


def _cli(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "backfill_assets.cli", *args, "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{args} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def main() -> None:
    """Import, run once through the CLI, read the meter."""
    p = argparse.ArgumentParser(prog="bench/run utilization")
    p.add_argument("--tenants", type=int, default=10)
    p.add_argument("--posts", type=int, default=1500, help="posts in all")
    p.add_argument("--rpm", type=int, default=600)
    p.add_argument("--latency-ms", type=float, default=200.0)
    p.add_argument("--concurrency", type=int, default=64)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-util-") as tmp:
        work = Path(tmp)
        sim, base = _start_sim(args.rpm, args.latency_ms)
        try:
            env = clean_env(
                DAGSTER_HOME=str(work / "home"),
                BACKFILL_DATABASE_URL=f"sqlite:///{work / 'store.db'}",
                BACKFILL_MODEL_BACKEND="openai",
                BACKFILL_MODEL="gpt-4o-mini",
                BACKFILL_MODEL_BASE_URL=base,
                BACKFILL_RPM=str(args.rpm),
                BACKFILL_CONCURRENCY=str(args.concurrency),
            )
            export = work / "posts.jsonl"
            with export.open("w") as fh:
                for i in range(args.posts):
                    tenant = f"tenant-{i % args.tenants:02d}"
                    text = f"{tenant} post {i}: as described, quick delivery"
                    fh.write(json.dumps({"tenant_id": tenant, "post_id": f"p{i}", "text": text}))
                    fh.write("\n")
            _cli(["import", str(export)], env)
            t0 = time.monotonic()
            run = _cli(["run"], env)
            wall = time.monotonic() - t0
            meter = httpx.get(f"{base.removesuffix('/v1')}/_sim/meter", timeout=30).json()
        finally:
            sim.terminate()
    stamps = sorted(meter["timestamps"])
    span = stamps[-1] - stamps[0]
    # n admissions over [first, last]: n - 1 intervals at the limit would take (n - 1) / rate.
    rpm = (len(stamps) - 1) / span * 60.0 if span > 0 else 0.0
    requests = int(meter["requests_total"])
    refused = int(meter["responses_by_status"].get("429", 0))
    doc = {
        "tenants": args.tenants,
        "posts": args.posts,
        "dagster_runs": len(run["runs"]),
        "wall_s": round(wall, 1),
        "send_span_s": round(span, 1),
        "admitted_rpm": round(rpm, 1),
        "share_of_limit": round(rpm / args.rpm, 4),
        "requests": requests,
        "share_429": round(refused / max(1, requests), 5),
        "accepted": run["totals"].get("accepted", 0),
    }
    print(
        f"{doc['tenants']} tenants, {doc['posts']} posts, {doc['dagster_runs']} Dagster run(s): "
        f"{doc['admitted_rpm']} req/min of {args.rpm} ({doc['share_of_limit']:.2%}), "
        f"429s {refused}/{requests} ({doc['share_429']:.2%}), wall {doc['wall_s']} s"
    )
    print(json.dumps(doc), flush=True)


if __name__ == "__main__":
    main()
