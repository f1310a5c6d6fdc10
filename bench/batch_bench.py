"""Sync vs batch dispatch on the demo corpus: tokens billed and cost, against the simulator.

    bench/run batch [--model gpt-4o-mini] [--max-lines 50000] [--expire-count 0]

Imports ``backfill_assets/demo/posts.jsonl`` into two fresh SQLite stores and runs every
partition once in sync mode (the HTTP adapter) and once in batch mode, each against its own
in-process simulator with the same seed. Tokens come from the simulator's meter (what the
provider billed), cost from the ledger (what we booked: list price in sync mode, the batch
price in batch mode). ``--expire-count N`` lets the first N batches expire with 30% of their
lines unfinished, to show that resubmitting only those lines costs no extra tokens.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from backfill_assets.config.variables import RunSettings
from backfill_assets.dispatch.batch_options import BatchOptions
from backfill_assets.dispatch.pipeline import PartitionRef, RunOptions, run_partitions
from backfill_assets.domain.money.nanos import usd_text
from backfill_assets.domain.policy.rubric import TASK_VERSION, Rubric
from backfill_assets.domain.work.keys import SLICE_COUNT, Versions
from backfill_assets.domain.work.outcomes import RetryPolicy
from backfill_assets.ingest.importer import import_path
from backfill_assets.ledger.engines import engine_for
from backfill_assets.ledger.reports import tenant_ids
from backfill_assets.providers.batch_client import BatchEndpoint
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.providers.ratelimit import LimiterConfig, LimiterRegistry
from backfill_assets.providersim import SimConfig, Simulator
from bench.common import ROOT

DEMO = ROOT / "backfill_assets" / "demo" / "posts.jsonl"
RETRY = RetryPolicy(
    max_attempts=5, retry_base_seconds=0.05, retry_max_seconds=0.5, retry_after_max_seconds=900.0
)


def _store(workdir: Path, name: str) -> tuple[sa.engine.Engine, list[PartitionRef]]:
    engine = engine_for(f"sqlite:///{workdir / f'{name}-{uuid.uuid4().hex[:6]}.db'}")
    import_path(engine, DEMO)
    with engine.connect() as conn:
        tenants = tenant_ids(conn)
    refs = [PartitionRef(f"s{s:02d}|{t}", t, s) for t in tenants for s in range(SLICE_COUNT)]
    return engine, refs


def _booked(engine: sa.engine.Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        usage = conn.execute(
            sa.text(
                "SELECT count(*), coalesce(sum(tokens_in + tokens_out), 0), coalesce(sum(cost_nanos), 0)"
                " FROM ledger_events WHERE type = 'usage'"
            )
        ).one()
        results = conn.execute(sa.text("SELECT count(*) FROM results")).scalar_one()
    return {
        "usage_events": int(usage[0]),
        "tokens": int(usage[1]),
        "cost_nanos": int(usage[2]),
        "results": int(results),
    }


def run_mode(mode: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One full pass over the demo corpus in ``mode``; figures from the meter and the ledger."""
    engine, refs = _store(workdir, mode)
    rubric = Rubric()
    versions = Versions(TASK_VERSION, rubric.key_version, args.model)
    sim_config = SimConfig(
        seed=7,
        batch_processing_ms=50,
        batch_expire_count=args.expire_count if mode == "batch" else 0,
    )
    with Simulator(sim_config) as sim:
        limiter = LimiterRegistry().get(mode, LimiterConfig())
        if mode == "sync":
            options = RunOptions(run=RunSettings(concurrency=32), retry=RETRY)
        else:
            endpoint = BatchEndpoint(sim.base_url, args.model)
            batch = BatchOptions(endpoint=endpoint, max_lines=args.max_lines, poll_seconds=0.02)
            options = RunOptions(dispatch_mode="batch", retry=RETRY, batch=batch)
        started = time.perf_counter()
        run_partitions(
            engine,
            refs,
            lambda: OpenAIHttpModel(base_url=sim.base_url, model=args.model, limiter=limiter),
            versions,
            rubric,
            f"bench-{mode}",
            options,
        )
        wall = time.perf_counter() - started
        meter = sim.meter.snapshot()
    booked = _booked(engine)
    return {
        "mode": mode,
        "posts": booked["results"],
        "billed_tokens": meter.billed_tokens_total,
        "billed_calls": len(meter.billed),
        "booked_tokens": booked["tokens"],
        "cost_usd": usd_text(booked["cost_nanos"]),
        "batches": meter.batch_creates_total,
        "wall_s": round(wall, 2),
    }


def main() -> None:
    """Print one line per mode, the comparison, and a JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-4o-mini", help="a model with a list price")
    parser.add_argument("--max-lines", type=int, default=50_000, help="lines per batch file")
    parser.add_argument("--expire-count", type=int, default=0, help="batches that expire")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="batch-bench-") as tmp:
        sync = run_mode("sync", args, Path(tmp))
        batch = run_mode("batch", args, Path(tmp))
    for doc in (sync, batch):
        print(
            f"{doc['mode']:>5}: {doc['posts']} posts, {doc['billed_tokens']:,} tokens billed in "
            f"{doc['billed_calls']} calls, ${doc['cost_usd']} booked, "
            f"{doc['batches']} batches, {doc['wall_s']} s"
        )
    sync_usd, batch_usd = Decimal(sync["cost_usd"]), Decimal(batch["cost_usd"])
    ratio = batch_usd / sync_usd if sync_usd else Decimal("NaN")
    tokens = batch["billed_tokens"] / sync["billed_tokens"] if sync["billed_tokens"] else 0.0
    print(f"batch/sync: tokens billed x{tokens:.3f}, cost x{ratio:.3f} ({args.model})")
    print(json.dumps({"sync": sync, "batch": batch, "cost_ratio": str(round(ratio, 4))}))


if __name__ == "__main__":
    main()
