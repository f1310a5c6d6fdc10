"""Provider-path benchmark: the adaptive limiter vs a fixed-concurrency baseline, over HTTP.

    bench/run http [--posts 20000] [--rpm 3000] [--tpm 600000] [--latency-ms 200]
                   [--scenarios adaptive,baseline,2x,2x-headers] [--concurrency 64]

Each scenario runs the real pipeline (dispatcher, writer, SQLite store, HTTP adapter) in this
process against a fresh ``backfill-moderation provider-sim`` in its own process, on a copy of
one imported store. Figures come from the simulator's meter (what the provider admitted, when)
and from the client (latency of answered calls, when each 429 came back):

- ``adaptive``   told the right limits;
- ``baseline``   no client-side limiter at all, ``--baseline-concurrency`` calls in flight,
                 per-key retries after Retry-After (what a fixed-concurrency client does);
- ``2x``         told limits twice the real ones, advertised limit headers ignored (pure AIMD);
- ``2x-headers`` the same, but the ``x-ratelimit-limit-*`` headers are trusted.

"Share of limit" is the rate the provider admitted in the steady window (after a 5 s warm-up,
before the final 5 s drain) over the binding limit: requests/min against RPM, or the provider's
token charge (prompt + max_tokens) per minute against TPM, whichever is nearer its limit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from backfill_assets.config.variables import HttpSettings, ModelSettings, RunSettings
from backfill_assets.defs.model_resources import OpenAIModelResource
from backfill_assets.demo.generate import write_export
from backfill_assets.dispatch.pipeline import PartitionRef, RunOptions, run_partitions
from backfill_assets.domain.policy.rubric import MAX_OUTPUT_TOKENS, TASK_VERSION, Rubric
from backfill_assets.domain.work.keys import SLICE_COUNT, Versions
from backfill_assets.domain.work.outcomes import RetryPolicy
from backfill_assets.ingest.importer import import_path
from backfill_assets.ledger.engines import engine_for
from backfill_assets.providers.models.base import ModelRequest, ModelResponse
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.providers.ratelimit import (
    SHARED_LIMITERS,
    EndpointLimiter,
    LimiterConfig,
    Permit,
)
from backfill_assets.providersim import MeterSnapshot
from bench.common import ROOT

MODEL = "gpt-4o-mini"
WARMUP_S = 5.0
TAIL_S = 5.0
SCENARIOS = ("adaptive", "baseline", "2x", "2x-headers")


class Recorder(OpenAIHttpModel):
    """The real adapter, noting (monotonic time, status) of every answer."""

    log: list[tuple[float, int | None]] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        try:
            response = await super().complete(request)
        except Exception as exc:
            Recorder.log.append((time.monotonic(), getattr(exc, "status", None)))
            raise
        Recorder.log.append((time.monotonic(), 200))
        return response


class NoLimiter(EndpointLimiter):
    """Baseline: admits at once and ignores all feedback (no pacing, no pause, no AIMD)."""

    def __init__(self) -> None:
        super().__init__(LimiterConfig(HttpSettings(adaptive=False, trust_limit_headers=False)))

    async def acquire(self, tokens: int, tenant: str | None = None) -> Permit:
        return Permit(tokens, time.monotonic(), 1.0)

    def on_success(self, *args: Any, **kwargs: Any) -> None:
        return None

    def on_rate_limited(self, *args: Any, **kwargs: Any) -> None:
        return None

    def on_failure(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass
class Scenario:
    name: str
    rpm: int
    tpm: int
    adaptive: bool
    trust_headers: bool
    limited: bool
    concurrency: int


def _start_sim(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    cmd = [
        sys.executable,
        "-m",
        "backfill_assets.cli",
        "provider-sim",
        "--port",
        "0",
        "--rpm",
        str(args.rpm),
        "--tpm",
        str(args.tpm),
        "--latency-ms",
        str(args.latency_ms),
        "--latency-sigma",
        str(args.latency_sigma),
        "--seed",
        "7",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    prefix = "provider-sim listening on "
    if not line.startswith(prefix):
        proc.kill()
        raise RuntimeError(f"simulator did not start: {line!r}")
    return proc, line.removeprefix(prefix)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def _figures(
    sc: Scenario,
    args: argparse.Namespace,
    meter: MeterSnapshot,
    latencies: list[float],
    answers: list[tuple[float, int | None]],
    elapsed: float,
) -> dict[str, Any]:
    stamps = sorted(meter.timestamps)
    start, end = stamps[0] + WARMUP_S, stamps[-1] - TAIL_S
    steady = sum(1 for t in stamps if start <= t < end)
    rpm = steady / max(1e-9, end - start) * 60.0
    prompts = [c.prompt_tokens for c in meter.billed.values()]
    charge = statistics.mean(prompts) + MAX_OUTPUT_TOKENS if prompts else 0.0
    tpm = rpm * charge
    shares = {
        "rpm": rpm / args.rpm if args.rpm else 0.0,
        "tpm": tpm / args.tpm if args.tpm else 0.0,
    }
    binding = max(shares, key=lambda k: shares[k])
    refused = meter.responses_by_status.get(429, 0)
    first = answers[0][0] if answers else 0.0
    late = [s for t, s in answers if t - first >= 60.0]
    return {
        "scenario": sc.name,
        "client_rpm": sc.rpm,
        "client_tpm": sc.tpm,
        "concurrency": sc.concurrency,
        "posts": len({c.correlation_id for c in meter.billed.values()}),
        "wall_s": round(elapsed, 1),
        "admitted_rpm": round(rpm, 1),
        "charged_tpm": round(tpm),
        "binding_limit": binding,
        "share_of_limit": round(shares[binding], 4),
        "rpm_share": round(shares["rpm"], 4),
        "tpm_share": round(shares["tpm"], 4),
        "requests": meter.requests_total,
        "share_429": round(refused / max(1, meter.requests_total), 5),
        "share_429_after_60s": round(late.count(429) / max(1, len(late)), 5) if late else None,
        "latency_p50_ms": _pct(latencies, 0.50),
        "latency_p95_ms": _pct(latencies, 0.95),
    }


def _run_scenario(
    sc: Scenario, args: argparse.Namespace, template: Path, work: Path
) -> dict[str, Any]:
    proc, base_url = _start_sim(args)
    try:
        store = work / f"{sc.name}-{uuid.uuid4().hex[:6]}.db"
        shutil.copyfile(template, store)
        engine = engine_for(f"sqlite:///{store}")
        resource = OpenAIModelResource(
            ModelSettings(model=MODEL, model_base_url=base_url),
            HttpSettings(
                rpm=sc.rpm, tpm=sc.tpm, adaptive=sc.adaptive, trust_limit_headers=sc.trust_headers
            ),
        )
        # The same process-wide limiter the resource's adapters use.
        limiter = SHARED_LIMITERS.get(f"{base_url}#{MODEL}", resource.limiter_config())
        Recorder.log = []

        def make() -> OpenAIHttpModel:
            return Recorder(
                base_url=base_url,
                model=MODEL,
                limiter=limiter if sc.limited else NoLimiter(),
            )

        rubric = Rubric()
        versions = Versions(TASK_VERSION, rubric.key_version, MODEL)
        tenants = [f"tenant-{i:02d}" for i in range(args.tenants)]
        refs = [PartitionRef(f"s{s:02d}|{t}", t, s) for t in tenants for s in range(SLICE_COUNT)]
        t0 = time.perf_counter()
        reports = run_partitions(
            engine,
            refs,
            make,
            versions,
            rubric,
            f"bench-{sc.name}",
            RunOptions(
                run=RunSettings(concurrency=sc.concurrency),
                retry=RetryPolicy(
                    max_attempts=20,
                    retry_base_seconds=0.5,
                    retry_max_seconds=30.0,
                    retry_after_max_seconds=900.0,
                ),
            ),
        )
        elapsed = time.perf_counter() - t0
        root = base_url.removesuffix("/v1")
        meter = MeterSnapshot.from_dict(httpx.get(f"{root}/_sim/meter", timeout=30).json())
        latencies = [x for r in reports for x in r.stats.latencies_ms]
        doc = _figures(sc, args, meter, latencies, Recorder.log, elapsed)
        outcomes: dict[str, int] = {}
        for r in reports:
            for k, v in r.stats.outcomes.items():
                outcomes[str(k)] = outcomes.get(str(k), 0) + v
        doc["outcomes"] = outcomes
        doc["limiter"] = limiter.snapshot() if sc.limited else None
        return doc
    finally:
        proc.terminate()
        proc.wait(10)


def _scenarios(args: argparse.Namespace) -> list[Scenario]:
    table = {
        "adaptive": Scenario("adaptive", args.rpm, args.tpm, True, True, True, args.concurrency),
        "baseline": Scenario("baseline", 0, 0, False, False, False, args.baseline_concurrency),
        "2x": Scenario("2x", 2 * args.rpm, 2 * args.tpm, True, False, True, args.concurrency),
        "2x-headers": Scenario(
            "2x-headers", 2 * args.rpm, 2 * args.tpm, True, True, True, args.concurrency
        ),
    }
    return [table[name] for name in args.scenarios.split(",")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--posts", type=int, default=20000, help="posts in total")
    p.add_argument("--tenants", type=int, default=8)
    p.add_argument("--rpm", type=int, default=3000, help="the simulator's real RPM")
    p.add_argument("--tpm", type=int, default=600000, help="the simulator's real TPM")
    p.add_argument("--latency-ms", type=float, default=200.0, help="median latency")
    p.add_argument("--latency-sigma", type=float, default=0.5, help="lognormal sigma")
    p.add_argument(
        "--concurrency", type=int, default=64, help="dispatch concurrency (limited runs)"
    )
    p.add_argument("--baseline-concurrency", type=int, default=16)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--out", help="also write the figures as JSON here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="http-bench-") as tmp:
        work = Path(tmp)
        tenants = [f"tenant-{i:02d}" for i in range(args.tenants)]
        write_export(work / "posts.jsonl", tenants, args.posts // args.tenants, bad_lines=False)
        template = work / "template.db"
        engine = engine_for(f"sqlite:///{template}")
        import_path(engine, work / "posts.jsonl")
        with engine.connect() as conn:  # copies of the file must hold everything
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        engine.dispose()
        results = []
        for sc in _scenarios(args):
            print(f"... {sc.name}", file=sys.stderr, flush=True)
            results.append(_run_scenario(sc, args, template, work))
            print(json.dumps(results[-1], sort_keys=True), flush=True)
    cols = [
        "scenario",
        "concurrency",
        "client_rpm",
        "admitted_rpm",
        "binding_limit",
        "share_of_limit",
        "share_429",
        "share_429_after_60s",
        "latency_p50_ms",
        "latency_p95_ms",
        "wall_s",
    ]
    print("\n" + " | ".join(cols))
    for r in results:
        print(" | ".join(str(r.get(c)) for c in cols))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
