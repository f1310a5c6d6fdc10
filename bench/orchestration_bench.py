"""Orchestration benchmark: a 48-partition backfill of the demo data (3 tenants x 16 slices).

    bench/run orchestration [--skip-default] [--port 3390]

Compares, on the embedded SQLite instance and store:
  cli      `backfill-moderation run`: in-process execution, one run per tenant (3 runs);
  ours     a partition backfill launched through the UI's GraphQL API and run by the daemon
           with our settings (BackfillPolicy.multi_run(16), in-process executor);
  default  the same backfill with Dagster's default shape: one run per partition and the
           multiprocess executor (BACKFILL_PARTITIONS_PER_RUN=1 BACKFILL_EXECUTOR=multiprocess).
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

from bench.common import ROOT, clean_env

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


def cli_run(work: Path) -> float:
    home = work / "cli"
    home.mkdir()
    env = _env(home, {})
    _cli(["import", str(DEMO)], env)
    t0 = time.perf_counter()
    out = _cli(["run", "--json"], env)
    wall = time.perf_counter() - t0
    n = len(json.loads(out.stdout.strip().splitlines()[-1])["partitions"])
    assert n == 48, n
    return wall


def daemon_backfill(
    work: Path, name: str, port: int, extra: dict[str, str]
) -> tuple[float, int, str]:
    home = work / name
    home.mkdir()
    (home / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text())
    env = _env(home, extra)
    _cli(["import", str(DEMO)], env)
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
        keys = [f"s{s:02d}|{t}" for t in TENANTS for s in range(16)]
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
    p.add_argument(
        "--skip-default", action="store_true", help="skip Dagster's default setup (~5 min)"
    )
    p.add_argument("--port", type=int, default=3390)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bf-orch-") as tmp:
        work = Path(tmp)
        print(
            "# orchestration benchmark: 48-partition backfill of the demo data (600 posts), SQLite"
        )
        print(f"cli      backfill-moderation run (in-process, 3 runs): {cli_run(work):.1f} s")
        wall, runs, status = daemon_backfill(work, "ours", a.port, {})
        print(
            f"ours     UI/GraphQL backfill, multi_run(16) + in-process: {wall:.1f} s, {runs} runs, {status}"
        )
        if not a.skip_default:
            wall_d, runs_d, status_d = daemon_backfill(
                work,
                "default",
                a.port + 1,
                {"BACKFILL_PARTITIONS_PER_RUN": "1", "BACKFILL_EXECUTOR": "multiprocess"},
            )
            print(
                f"default  UI/GraphQL backfill, 1 partition/run + multiprocess: {wall_d:.1f} s, {runs_d} runs, {status_d}"
            )
            print(f"ratio    default / ours = {wall_d / wall:.1f}x")


if __name__ == "__main__":
    main()
