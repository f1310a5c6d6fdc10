"""``run --deadline`` scenarios at 5,000 posts: what each costs and when it finishes.

    bench/run deadline [--posts 5000] [--tenants 10] [--store sqlite|pg] [--only NAME]
                       [--cancel-seconds 45]

Each scenario runs the whole CLI (``run --deadline ... --json``) against its own in-process
simulator with batch timing controlled, on a fresh store, then reads the simulator's meter:
- ``long``: a 3-day deadline, batches that complete in 2 s: everything on batch;
- ``flex``: a deadline shorter than any batch (the 24 h prior), flex refusing 30%;
- ``flex-down``: the same with flex refusing everything: flex falls back to standard in time;
- ``stall``: batches that would take 2 minutes against a plan that assumes 1 s: the
  switch-over cancels them, books what they completed and sends the rest at standard;
- ``kill``: ``stall`` with a SIGKILL right after the cancels, then the run resumed;
- ``slow-cancel``: ``stall`` with cancels that stay ``cancelling`` ``--cancel-seconds``, as
  the plan knows (``BACKFILL_BATCH_CANCEL_SECONDS``): it switches over that much earlier;
- ``slow-cancel-unplanned``: the same cancels against a plan that allows 1 s: the run waits
  for them (nothing paid twice) and misses the deadline by the overrun;
- ``impossible``: a deadline the limit cannot meet: refused before any request.

Per scenario: the keys billed per tier, what the simulator billed against the same billed
tokens priced all at standard and all at batch, the time the labels were done against the
deadline, and the keys paid twice (must be 0).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from backfill_assets.domain.money.nanos import usd_text
from backfill_assets.domain.money.prices import PriceTable, Tier
from backfill_assets.ingest.importer import import_path
from backfill_assets.ledger.engines import engine_for
from backfill_assets.providersim import SimConfig, Simulator
from bench.common import ROOT, clean_env, drop_store, new_store


@dataclass(frozen=True)
class Scenario:
    name: str
    deadline: str
    sim: dict[str, Any]
    env: dict[str, str]
    margin: str = "10"
    kill: bool = False
    expect_code: int = 0
    extra: list[str] = field(default_factory=list)


# 200 keys/s (BACKFILL_RPM=12000), as the flex scenarios: see scenarios(). The simulator's
# cancels end within milliseconds: the plan allows none (and one status poll).
STALL = Scenario(
    "stall",
    "60s",
    {"batch_processing_ms": 120_000.0},
    {
        "BACKFILL_RPM": "12000",
        "BACKFILL_BATCH_PRIOR_SECONDS": "1",
        "BACKFILL_BATCH_CANCEL_SECONDS": "0",
    },
    margin="30",
)


def scenarios(cancel_s: float) -> tuple[Scenario, ...]:
    """Every scenario; the slow cancels take ``cancel_s`` seconds."""
    slow = dataclasses.replace(
        STALL,
        name="slow-cancel",
        deadline="2m",
        sim={**STALL.sim, "batch_cancel_ms": cancel_s * 1000.0},
        env={**STALL.env, "BACKFILL_BATCH_CANCEL_SECONDS": f"{cancel_s:g}"},
    )
    return (
        Scenario("long", "3d", {"batch_processing_ms": 2_000.0}, {"BACKFILL_RPM": "6000"}),
        # 200 keys/s: what this machine's synchronous path sustains with room to spare (the
        # plan trusts the configured limit, so a limit the client cannot reach would be a
        # wrong input).
        Scenario(
            "flex",
            "10m",
            {"flex_unavailable_share": 0.3},
            {"BACKFILL_RPM": "12000", "BACKFILL_SERVICE_TIER": "flex"},
        ),
        Scenario(
            "flex-down",
            "90s",
            {"flex_unavailable_share": 1.0},
            {"BACKFILL_RPM": "12000", "BACKFILL_SERVICE_TIER": "flex"},
        ),
        STALL,
        dataclasses.replace(STALL, name="kill", kill=True),
        slow,
        dataclasses.replace(
            slow,
            name="slow-cancel-unplanned",
            env={**slow.env, "BACKFILL_BATCH_CANCEL_SECONDS": "1"},
            expect_code=1,
        ),
        Scenario("impossible", "5s", {}, {"BACKFILL_RPM": "600"}, expect_code=2),
    )


def _posts(path: Path, posts: int, tenants: int) -> None:
    with path.open("w") as out:
        for i in range(posts):
            tenant = f"tenant-{i % tenants:03d}"
            record = {"tenant_id": tenant, "post_id": f"p{i}", "text": f"post {i} of {tenant}"}
            out.write(json.dumps(record) + "\n")


def _cli(env: dict[str, str], argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "backfill_assets.cli", "run", *argv, "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )


def run(scenario: Scenario, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One scenario on a fresh store and simulator."""
    url = new_store(args.store, workdir)
    try:
        jsonl = workdir / f"{scenario.name}.jsonl"
        _posts(jsonl, args.posts, args.tenants)
        import_path(engine_for(url), jsonl)
        with Simulator(SimConfig(seed=11, **scenario.sim)) as sim:
            base = clean_env()
            env = {
                **base,
                "DAGSTER_HOME": str(workdir / f"home-{scenario.name}"),
                "BACKFILL_DATABASE_URL": url,
                "BACKFILL_MODEL_BACKEND": "openai",
                "BACKFILL_MODEL": "gpt-4o-mini",
                "BACKFILL_MODEL_BASE_URL": sim.base_url,
                "BACKFILL_MODEL_API_KEY": "sk-bench-deadline",
                "BACKFILL_BATCH_POLL_SECONDS": "0.2",
                "BACKFILL_CONCURRENCY": "64",
                **scenario.env,
            }
            argv = ["--deadline", scenario.deadline, "--margin", scenario.margin, *scenario.extra]
            started = time.perf_counter()
            killed = None
            if scenario.kill:
                killed = _cli({**env, "BACKFILL_KILL_AT": "cancel"}, argv).returncode
            done = _cli(env, argv)
            wall = time.perf_counter() - started
            meter = sim.meter.snapshot()
    finally:
        drop_store(url)
    if not done.stdout.strip():
        raise RuntimeError(f"{scenario.name}: exit {done.returncode}\n{done.stderr[-3000:]}")
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    info = doc.get("deadline") or {}
    plan = info.get("plan") or doc["plan"]
    tiers = {"batch": 0, "flex": 0, "standard": 0}
    # The same billed tokens priced all at standard and all at batch: what the mix saved.
    prices = PriceTable.from_json("")
    at = {Tier.STANDARD: 0, Tier.BATCH: 0}
    for call in meter.billed.values():
        tier = "batch" if call.batch_id else ("flex" if call.service_tier == "flex" else "standard")
        tiers[tier] += 1
        for t in at:
            at[t] += prices.cost(
                call.model,
                call.prompt_tokens,
                call.completion_tokens,
                cached=call.cached_tokens,
                tier=t,
            )
    twice = sum(1 for b in meter.billed_by_correlation_id.values() if b.requests > 1)
    out: dict[str, Any] = {
        "scenario": scenario.name,
        "exit": done.returncode,
        "expected_exit": scenario.expect_code,
        "killed": killed,
        "planned": plan["keys"],
        "billed": tiers,
        "requests": meter.requests_total,
        "paid_twice": twice,
        "billed_usd": usd_text(meter.billed_cost_nanos),
        "all_standard_usd": usd_text(at[Tier.STANDARD]),
        "all_batch_usd": usd_text(at[Tier.BATCH]),
        "planned_usd": plan["cost_usd"],
        "wall_s": round(wall, 1),
    }
    if "labelled_at" in info:
        deadline = dt.datetime.fromisoformat(info["deadline"])
        labelled = dt.datetime.fromisoformat(info["labelled_at"])
        out["slack_s"] = round((deadline - labelled).total_seconds(), 1)
        out["deadline_s"] = round(
            (deadline - dt.datetime.fromisoformat(plan["now"])).total_seconds(), 1
        )
        out["met"] = info["met"]
        if info.get("switch_over"):
            out["switch_s"] = round(
                (
                    dt.datetime.fromisoformat(info["switch_over"])
                    - dt.datetime.fromisoformat(plan["now"])
                ).total_seconds(),
                1,
            )
    return out


def _ratio(part: str, whole: str) -> str:
    return f"{Decimal(part) / Decimal(whole):.2f}" if Decimal(whole) else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--posts", type=int, default=5000)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--store", choices=["sqlite", "pg"], default="sqlite")
    parser.add_argument("--only", action="append", default=[], help="scenario name(s)")
    parser.add_argument(
        "--cancel-seconds",
        type=float,
        default=45.0,
        help="how long a cancel stays 'cancelling' in the slow-cancel scenarios",
    )
    args = parser.parse_args()
    chosen = [s for s in scenarios(args.cancel_seconds) if not args.only or s.name in args.only]
    rows = []
    with tempfile.TemporaryDirectory(prefix="deadline-bench-") as tmp:
        for scenario in chosen:
            row = run(scenario, args, Path(tmp))
            rows.append(row)
            b = row["billed"]
            switch = f"switch-over at {row['switch_s']} s  " if "switch_s" in row else ""
            print(
                f"{row['scenario']:<10} billed batch/flex/standard {b['batch']}/{b['flex']}/"
                f"{b['standard']}  ${row['billed_usd']} = "
                f"{_ratio(row['billed_usd'], row['all_standard_usd'])}x all-standard, "
                f"{_ratio(row['billed_usd'], row['all_batch_usd'])}x all-batch  "
                + (
                    f"{switch}labelled {row['slack_s']} s before a {row['deadline_s']} s deadline  "
                    if "slack_s" in row
                    else f"exit {row['exit']}, {row['requests']} request(s)  "
                )
                + f"paid twice {row['paid_twice']}  wall {row['wall_s']} s",
                flush=True,
            )
    print(json.dumps({"store": args.store, "posts": args.posts, "scenarios": rows}))


if __name__ == "__main__":
    main()
