"""Orchestration benchmark: one plan of 16 slices a tenant, run each way partitions can run.

    bench/run orchestration [--posts 0] [--tenants 3] [--rounds 1] [--only cli,cli1,ours,default]

The plan: the demo data (600 posts, 3 tenants; ``--posts 0``) or ``--posts N`` generated posts
over ``--tenants T`` tenants, spread over 16 slices a tenant (T x 16 partitions). Compares, on
the embedded SQLite instance and store:
  cli      `backfill-moderation run`: in-process runs, the plan shared over the CLI's helper
           processes (BACKFILL_RUN_PROCESSES unset: the cores, at most 4; a small plan forks none);
  cli1     the same with BACKFILL_RUN_PROCESSES=1: one process;
  ours     a partition backfill launched through the UI's GraphQL API and run by the daemon
           with our settings (BackfillPolicy.multi_run(16), in-process executor): Dagster's run
           launcher starts each run in its own process, up to the run queue's 4 at once;
  default  the same backfill with Dagster's default shape: one run per partition and the
           multiprocess executor (BACKFILL_PARTITIONS_PER_RUN=1 BACKFILL_EXECUTOR=multiprocess).
``cli`` and ``cli1`` alternate ``--rounds`` times (medians); the daemon shapes run once each.
The last line is JSON (for ``bench/run ab``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import ROOT, clean_env, median
from bench.scale_bench import tenant_names, write_export

DEMO = ROOT / "backfill_assets" / "demo" / "posts.jsonl"
TENANTS = ["acme", "globex", "initech"]

LAUNCH = """
mutation($p: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $p) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}"""
STATUS = """
query($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill { status numPartitions }
    ... on PythonError { message }
  }
}"""
TERMINAL = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}


def _env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    env = clean_env(
        DAGSTER_HOME=str(home),
        BACKFILL_DATABASE_URL=f"sqlite:///{home / 'backfill.db'}",
        # One post a partition before splitting: the demo's 200 posts a tenant use all 16.
        BACKFILL_SLICE_TARGET_POSTS="1",
        **extra,
    )
    return env


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "backfill_assets.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )


def _gql(port: int, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(
        f"http://127.0.0.1:{port}/graphql",
        json={"query": query, "variables": variables},
        timeout=60,
    )
    r.raise_for_status()
    doc: dict[str, Any] = r.json()
    if doc.get("errors"):
        raise RuntimeError(doc["errors"])
    return doc["data"]


def cli_run(work: Path, name: str, export: Path, partitions: int, extra: dict[str, str]) -> float:
    home = work / name
    home.mkdir()
    env = _env(home, extra)
    _cli(["import", str(export)], env)
    t0 = time.perf_counter()
    out = _cli(["run", "--json"], env)
    wall = time.perf_counter() - t0
    n = len(json.loads(out.stdout.strip().splitlines()[-1])["partitions"])
    assert n == partitions, (n, partitions)
    return wall


def daemon_backfill(
    work: Path, name: str, port: int, export: Path, tenants: list[str], extra: dict[str, str]
) -> tuple[float, int, str]:
    home = work / name
    home.mkdir()
    (home / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text())
    env = _env(home, extra)
    _cli(["import", str(export)], env)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dagster",
            "dev",
            "-w",
            str(ROOT / "workspace.yaml"),
            "-p",
            str(port),
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("dagster dev did not start")
            time.sleep(0.5)
        keys = [f"s{s:02d}|{t}" for t in tenants for s in range(16)]
        t0 = time.perf_counter()
        res = _gql(
            port,
            LAUNCH,
            {
                "p": {
                    "partitionNames": keys,
                    "assetSelection": [{"path": ["moderation_labels"]}],
                    "title": f"bench-{name}",
                }
            },
        )
        launched = res["launchPartitionBackfill"]
        if launched["__typename"] != "LaunchBackfillSuccess":
            raise RuntimeError(launched)
        while True:
            st = _gql(port, STATUS, {"id": launched["backfillId"]})["partitionBackfillOrError"]
            if st.get("status") in TERMINAL:
                break
            if time.perf_counter() - t0 > 1800:
                raise RuntimeError("backfill did not finish in 30 minutes")
            time.sleep(1.0)
        wall = time.perf_counter() - t0
        runs = subprocess.run(
            [
                sys.executable,
                "-c",
                "import dagster as dg; print(len(dg.DagsterInstance.get().get_run_records()))",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return wall, int(runs), str(st["status"])
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--posts", type=int, default=0, help="generated posts (0: the demo's 600)")
    p.add_argument("--tenants", type=int, default=3, help="with --posts: tenants to spread over")
    p.add_argument("--rounds", type=int, default=1, help="cli/cli1 pairs, alternating")
    p.add_argument("--only", default="cli,cli1,ours,default", help="shapes to run, comma-separated")
    p.add_argument(
        "--skip-default", action="store_true", help="skip Dagster's default setup (~5 min)"
    )
    p.add_argument("--port", type=int, default=3390)
    a = p.parse_args()
    shapes = set(a.only.split(","))
    if a.skip_default:
        shapes.discard("default")
    doc: dict[str, Any] = {"posts": a.posts or 600}
    with tempfile.TemporaryDirectory(prefix="bf-orch-") as tmp:
        work = Path(tmp)
        if a.posts:
            tenants = tenant_names(a.tenants)
            export = write_export(work / "posts.jsonl", a.posts, a.tenants)
        else:
            tenants, export = TENANTS, DEMO
        partitions = len(tenants) * 16
        print(
            f"# orchestration benchmark: {partitions}-partition backfill of {doc['posts']:,} "
            f"posts ({len(tenants)} tenants), SQLite"
        )
        walls: dict[str, list[float]] = {"cli": [], "cli1": []}
        for r in range(a.rounds):
            for name, extra in (("cli", {}), ("cli1", {"BACKFILL_RUN_PROCESSES": "1"})):
                if name in shapes:
                    walls[name].append(cli_run(work, f"{name}-{r}", export, partitions, extra))
        for name, label in (("cli", "run, helper processes"), ("cli1", "run, one process")):
            if walls[name]:
                doc[name] = round(median(walls[name]), 2)
                each = ", ".join(f"{w:.2f}" for w in walls[name])
                print(
                    f"{name:<8} backfill-moderation {label}: {doc[name]:.2f} s (median of {each})"
                )
        if "ours" in shapes:
            wall, runs, status = daemon_backfill(work, "ours", a.port, export, tenants, {})
            doc["ours"], doc["ours_runs"] = round(wall, 2), runs
            print(
                f"ours     UI/GraphQL backfill, multi_run(16) + in-process: {wall:.1f} s, {runs} runs, {status}"
            )
        if "default" in shapes:
            wall_d, runs_d, status_d = daemon_backfill(
                work,
                "default",
                a.port + 1,
                export,
                tenants,
                {"BACKFILL_PARTITIONS_PER_RUN": "1", "BACKFILL_EXECUTOR": "multiprocess"},
            )
            doc["default"], doc["default_runs"] = round(wall_d, 2), runs_d
            print(
                f"default  UI/GraphQL backfill, 1 partition/run + multiprocess: {wall_d:.1f} s, {runs_d} runs, {status_d}"
            )
        for name in ("cli1", "ours", "default"):
            if name in doc and "cli" in doc:
                print(f"ratio    {name} / cli = {doc[name] / doc['cli']:.2f}x")
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
