"""What the demo corpus costs under a long policy, at the standard, flex and batch tiers.

    bench/run cost [--flex-unavailable 0.2] [--examples 60]

The built-in policy with ``--examples`` worked examples added to its instructions (over 1,024
prompt tokens, so the provider caches the policy prefix), run over ``backfill_assets/demo``
once per tier against its own in-process simulator (usage reported in OpenAI's full shape,
the policy prefix read from cache). Per tier: the cost the ledger booked, the simulator's own
bill from its priced meter, the cached share of input tokens, and flex's capacity waits.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml

from backfill_assets.config.variables import RunSettings
from backfill_assets.dispatch.batch_options import BatchOptions
from backfill_assets.dispatch.pipeline import PartitionRef, RunOptions, run_partitions
from backfill_assets.domain.money.nanos import cached_share, usd_text
from backfill_assets.domain.money.prices import PriceTable, Tier
from backfill_assets.domain.policy.file import builtin_policy_text, load_policy
from backfill_assets.domain.policy.rubric import TASK_VERSION, Rubric
from backfill_assets.domain.work.keys import SLICE_COUNT, Versions
from backfill_assets.domain.work.outcomes import RetryPolicy
from backfill_assets.ingest.importer import import_path
from backfill_assets.ledger.engines import engine_for
from backfill_assets.ledger.reports import tenant_ids
from backfill_assets.providers.batch_client import BatchEndpoint
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.providers.models.rules import count_tokens
from backfill_assets.providers.ratelimit import LimiterConfig, LimiterRegistry
from backfill_assets.providersim import SimConfig, Simulator
from bench.common import ROOT

DEMO = ROOT / "backfill_assets" / "demo" / "posts.jsonl"
MODEL = "gpt-4o-mini"
RETRY = RetryPolicy(
    max_attempts=5, retry_base_seconds=0.02, retry_max_seconds=0.2, retry_after_max_seconds=900.0
)


def long_policy(workdir: Path, examples: int) -> Rubric:
    """The built-in policy with worked examples appended to its instructions."""
    doc = yaml.safe_load(builtin_policy_text())
    lines = [
        f"Example {i}: a post that repeats a link to a shop {i} times in one paragraph is spam; "
        f"a post that insults another member by name in example {i} is abuse."
        for i in range(1, examples + 1)
    ]
    doc["instructions"] = doc["instructions"].rstrip() + "\n" + "\n".join(lines) + "\n"
    path = workdir / "long-policy.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return Rubric(load_policy(path))


def _booked(engine: sa.engine.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT count(*), coalesce(sum(tokens_in), 0), coalesce(sum(tokens_cached), 0),"
                " coalesce(sum(cost_nanos), 0), coalesce(sum(tokens_out), 0)"
                " FROM ledger_events WHERE type = 'usage'"
            )
        ).one()
        results = conn.execute(sa.text("SELECT count(*) FROM results")).scalar_one()
    return {
        "calls": int(row[0]),
        "tokens_in": int(row[1]),
        "cached": int(row[2]),
        "cost": int(row[3]),
        "tokens_out": int(row[4]),
        "results": int(results),
    }


def run_tier(tier: str, rubric: Rubric, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One pass over the demo corpus at ``tier``."""
    engine = engine_for(f"sqlite:///{workdir / f'{tier}-{uuid.uuid4().hex[:6]}.db'}")
    import_path(engine, DEMO)
    with engine.connect() as conn:
        refs = [
            PartitionRef(f"s{s:02d}|{t}", t, s)
            for t in tenant_ids(conn)
            for s in range(SLICE_COUNT)
        ]
    prefix = count_tokens(rubric.system_prompt) + 4  # the simulator's count of the system message
    sim_config = SimConfig(
        seed=7,
        usage_shape="full",
        batch_usage_shape="full",
        cached_prefix_tokens=prefix,
        flex_unavailable_share=args.flex_unavailable if tier == "flex" else 0.0,
        batch_processing_ms=50,
    )
    versions = Versions(TASK_VERSION, rubric.key_version, MODEL)
    with Simulator(sim_config) as sim:
        limiter = LimiterRegistry().get(tier, LimiterConfig())
        sent = Tier.FLEX if tier == "flex" else Tier.STANDARD
        if tier == "batch":
            endpoint = BatchEndpoint(sim.base_url, MODEL)
            batch = BatchOptions(endpoint=endpoint, poll_seconds=0.02)
            options = RunOptions(dispatch_mode="batch", retry=RETRY, batch=batch)
        else:
            options = RunOptions(run=RunSettings(concurrency=32), retry=RETRY)
        started = time.perf_counter()
        run_partitions(
            engine,
            refs,
            lambda: OpenAIHttpModel(base_url=sim.base_url, model=MODEL, limiter=limiter, tier=sent),
            versions,
            rubric,
            f"bench-cost-{tier}",
            options,
        )
        wall = time.perf_counter() - started
        meter = sim.meter.snapshot()
    booked = _booked(engine)
    return {
        "tier": tier,
        "posts": booked["results"],
        "calls": booked["calls"],
        "prefix_tokens": prefix,
        "cached_share": cached_share(booked["cached"], booked["tokens_in"]),
        "booked_usd": usd_text(booked["cost"]),
        "simulator_usd": usd_text(meter.billed_cost_nanos),
        # The same tokens with no cache discount (priced once over the sums).
        "uncached_usd": usd_text(
            PriceTable.from_json("").cost(
                MODEL, booked["tokens_in"], booked["tokens_out"], tier=Tier(tier)
            )
        ),
        "equal": booked["cost"] == meter.billed_cost_nanos,
        "capacity_waits": meter.responses_by_status.get(429, 0),
        "wall_s": round(wall, 2),
    }


def main() -> None:
    """One line per tier and a JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flex-unavailable", type=float, default=0.2, help="flex 429 share")
    parser.add_argument("--examples", type=int, default=60, help="examples added to the policy")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cost-bench-") as tmp:
        rubric = long_policy(Path(tmp), args.examples)
        docs = [run_tier(t, rubric, args, Path(tmp)) for t in ("standard", "flex", "batch")]
    for d in docs:
        print(
            f"{d['tier']:>8}: {d['posts']} posts, {d['calls']} calls, prefix {d['prefix_tokens']} "
            f"tokens, cached share {d['cached_share']}, booked ${d['booked_usd']}, simulator "
            f"${d['simulator_usd']} ({'equal' if d['equal'] else 'DIFFERENT'}; without the "
            f"cache ${d['uncached_usd']}), "
            f"{d['capacity_waits']} capacity waits, {d['wall_s']} s"
        )
    print(json.dumps({"model": MODEL, "tiers": docs}))


if __name__ == "__main__":
    main()
