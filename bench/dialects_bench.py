"""Posts through each dialect against the simulator: throughput, requests and cost per 1,000.

    bench/run dialects [--posts 10000] [--tenants 20] [--latency-ms 20] [--rounds 3]

Each round runs the same posts (``--tenants`` tenants, ``docs/policies/forum-moderation.yaml``)
through ``run_partitions`` against an in-process simulator answering after ``--latency-ms``,
at concurrency 32, once per mode:

- ``chat-json``: chat completions answering the policy's JSON schema (``gpt-4o-mini``);
- ``moderation x1``: OpenAI's moderation endpoint, one post per request;
- ``moderation x32``: the same endpoint, up to 32 posts of one tenant per request;
- ``guard rules``: Llama Guard 3 with the policy's rules as its categories (``/completions``);
- ``guard built-in``: Llama Guard 3 with its built-in categories mapped (chat template);
- ``safeguard``: gpt-oss-safeguard-20b at reasoning effort ``low``;
- ``relabel``: after ``moderation x32``, a changed threshold: the same posts re-labelled from
  the stored scores (its requests are the ones made for it: none).

Per mode, the median over rounds of: wall seconds, posts per second, the requests the simulator
answered, the dollars the ledger booked per 1,000 posts and the simulator's own bill per 1,000
posts (equal or not), and the ratio of posts per second to ``chat-json``'s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from backfill_assets.config.variables import ModelSettings, RunSettings
from backfill_assets.dispatch.pipeline import PartitionRef, RunOptions, run_partitions
from backfill_assets.domain.money.nanos import usd_text
from backfill_assets.domain.money.prices import PriceTable
from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.policy.file import parse_policy
from backfill_assets.domain.policy.rubric import TASK_VERSION, Rubric
from backfill_assets.domain.work.keys import SLICE_COUNT, Versions
from backfill_assets.domain.work.outcomes import RetryPolicy
from backfill_assets.ingest.importer import import_path
from backfill_assets.ledger.engines import engine_for
from backfill_assets.ledger.reports import tenant_ids
from backfill_assets.providers.models.base import ModelAdapter
from backfill_assets.providers.models.llama_guard import LlamaGuardModel
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.providers.models.openai_moderation import OpenAIModerationModel
from backfill_assets.providers.models.safeguard import SafeguardModel
from backfill_assets.providers.ratelimit import LimiterConfig, LimiterRegistry
from backfill_assets.providersim import SimConfig, Simulator
from bench.common import ROOT

POLICY = ROOT / "docs" / "policies" / "forum-moderation.yaml"
RETRY = RetryPolicy(
    max_attempts=5, retry_base_seconds=0.02, retry_max_seconds=0.2, retry_after_max_seconds=900.0
)
TEXTS = (
    "great match last night, the keeper was brilliant",
    "you are a worthless idiot and everyone knows it",
    "I will find you and hurt you",
    "does anyone know when the next meetup is?",
    "some days I want to kill myself",
    "thanks for the tips, it worked",
)
# mode -> (dialect, model, posts per moderation request, variant)
MODES: dict[str, tuple[str, str, int, str]] = {
    "chat-json": ("chat-json", "gpt-4o-mini", 0, ""),
    "moderation x1": ("openai-moderation", "omni-moderation-latest", 1, ""),
    "moderation x32": ("openai-moderation", "omni-moderation-latest", 32, ""),
    "guard rules": ("llama-guard", "llama-guard-3-8b", 0, "3"),
    "guard built-in": ("llama-guard", "llama-guard-3-8b", 0, "3"),
    "safeguard": ("safeguard", "gpt-oss-safeguard-20b", 0, "low"),
}
RELABEL = "relabel"
# The simulator's list prices for the self-hosted models (USD per million tokens).
PRICES = PriceTable.from_json(
    '{"llama-guard-3-8b": {"input": 0.20, "output": 0.20}, '
    '"gpt-oss-safeguard-20b": {"input": 0.075, "output": 0.30}}'
)
# The guard's built-in categories, mapped onto the forum policy's rules.
GUARD_SECTION = "  llama-guard:\n    categories:\n      S1: V-1\n      S10: H-2\n      S11: S-1\n"


def _posts(path: Path, posts: int, tenants: int) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for i in range(posts):
            text = f"{TEXTS[i % len(TEXTS)]} (#{i})"
            fh.write(
                json.dumps({"tenant_id": f"t{i % tenants:03d}", "post_id": f"p{i}", "text": text})
            )
            fh.write("\n")


def _adapter(mode: str, base_url: str) -> Callable[[], ModelAdapter]:
    dialect, model, per, _variant = MODES[mode]
    limiter = LimiterRegistry().get(f"{mode}-{uuid.uuid4().hex}", LimiterConfig())
    settings = ModelSettings(model_dialect=dialect, reasoning_effort="low")
    kw: dict[str, Any] = {"base_url": base_url, "model": model, "limiter": limiter}
    if dialect == "openai-moderation":
        return lambda: OpenAIModerationModel(**kw, inputs_per_request=per)
    if dialect == "llama-guard":
        return lambda: LlamaGuardModel(**kw, settings=settings, prices=PRICES)
    if dialect == "safeguard":
        return lambda: SafeguardModel(**kw, settings=settings, prices=PRICES)
    return lambda: OpenAIHttpModel(**kw)


def _policy(mode: str, threshold: str = "0.5") -> Policy:
    text = POLICY.read_text(encoding="utf-8")
    text = text.replace(
        "violence: {label: threat, rule: V-1, threshold: 0.5}",
        (f"violence: {{label: threat, rule: V-1, threshold: {threshold}}}"),
    )
    if mode == "guard built-in":
        text += GUARD_SECTION
    return parse_policy(text)


def one_run(
    mode: str, export: Path, args: argparse.Namespace, workdir: Path
) -> list[tuple[str, dict[str, Any]]]:
    """The posts of ``export`` through ``mode`` against a fresh store and simulator (and for
    ``moderation x32``, the re-labelling after a changed threshold)."""
    dialect, model, _per, variant = MODES[mode]
    engine = engine_for(f"sqlite:///{workdir / f'{uuid.uuid4().hex[:8]}.db'}")
    import_path(engine, export)
    with engine.connect() as conn:
        refs = [
            PartitionRef(f"s{s:02d}|{t}", t, s)
            for t in tenant_ids(conn)
            for s in range(SLICE_COUNT)
        ]
    rubric = Rubric(_policy(mode), dialect, variant, 8192 if dialect == "safeguard" else 64)
    versions = Versions(TASK_VERSION, rubric.key_version, model, rubric.policy.mapping_version)
    options = RunOptions(run=RunSettings(concurrency=32), retry=RETRY)
    out = []
    with Simulator(SimConfig(seed=3, latency_median_ms=args.latency_ms)) as sim:
        adapter = _adapter(mode, sim.base_url)
        started = time.perf_counter()
        run_partitions(engine, refs, adapter, versions, rubric, f"bench-{mode}", options)
        wall = time.perf_counter() - started
        meter = sim.meter.snapshot()
        out.append((mode, _figures(engine, wall, meter)))
        if mode == "moderation x32":
            moved = Rubric(_policy(mode, "0.6"), dialect)
            again = Versions(TASK_VERSION, moved.key_version, model, moved.policy.mapping_version)
            started = time.perf_counter()
            reports = run_partitions(engine, refs, adapter, again, moved, "bench-relabel", options)
            wall = time.perf_counter() - started
            after = sim.meter.snapshot()
            figures = _figures(engine, wall, after)
            figures["requests"] -= out[0][1]["requests"]
            figures["relabelled"] = sum(r.stats.relabelled for r in reports)
            figures["posts_per_s"] = figures["relabelled"] / wall
            out.append((RELABEL, figures))
    return out


def _figures(engine: Any, wall: float, meter: Any) -> dict[str, Any]:
    with engine.connect() as conn:
        done, cost = conn.execute(
            sa.text(
                "SELECT (SELECT count(*) FROM results), "
                "(SELECT coalesce(sum(cost_nanos), 0) FROM ledger_events WHERE type = 'usage')"
            )
        ).one()
    requests = sum(bill.calls for bill in meter.billed_by_endpoint.values())
    per_1000 = 1000 / max(1, int(done))
    return {
        "posts": int(done),
        "wall_s": wall,
        "posts_per_s": int(done) / wall,
        "requests": requests,
        "booked_per_1000_nanos": round(int(cost) * per_1000),
        "simulator_per_1000_nanos": round(meter.billed_cost_nanos * per_1000),
        "equal": int(cost) == meter.billed_cost_nanos,
    }


def main() -> None:
    """A line per mode with medians and ratios, then one JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--posts", type=int, default=10_000)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--latency-ms", type=float, default=20.0, help="simulator's latency")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in [*MODES, RELABEL]}
    with tempfile.TemporaryDirectory(prefix="dialects-bench-") as tmp:
        export = Path(tmp) / "posts.jsonl"
        _posts(export, args.posts, args.tenants)
        for _round in range(args.rounds):
            for mode in MODES:  # alternating, so the machine's drift falls on every mode
                for name, figures in one_run(mode, export, args, Path(tmp)):
                    runs[name].append(figures)
    doc: dict[str, Any] = {"posts": args.posts, "latency_ms": args.latency_ms, "modes": {}}
    base = statistics.median(r["posts_per_s"] for r in runs["chat-json"])
    for mode, rs in runs.items():
        med = {
            k: statistics.median(r[k] for r in rs) for k in ("wall_s", "posts_per_s", "requests")
        }
        booked = statistics.median(r["booked_per_1000_nanos"] for r in rs)
        billed = statistics.median(r["simulator_per_1000_nanos"] for r in rs)
        row = {
            **med,
            "booked_per_1000_usd": usd_text(int(booked)),
            "simulator_per_1000_usd": usd_text(int(billed)),
            "equal": all(r["equal"] for r in rs),
            "throughput_vs_chat": round(med["posts_per_s"] / base, 2),
        }
        doc["modes"][mode] = row
        print(
            f"{mode:>15}: {med['wall_s']:.1f} s, {med['posts_per_s']:.0f} posts/s "
            f"({row['throughput_vs_chat']}x chat-json), {med['requests']:.0f} requests, "
            f"${row['booked_per_1000_usd']} per 1,000 posts booked, "
            f"${row['simulator_per_1000_usd']} billed ({'equal' if row['equal'] else 'DIFFERENT'})"
        )
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
