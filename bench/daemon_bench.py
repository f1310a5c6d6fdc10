"""The daemon path: a backfill launched as the UI launches it, to its labels applied.

    bench/run daemon [--sizes 10,100,1200] [--rounds 1] [--settings default,tuned]
                     [--rpm 600] [--latency-ms 200] [--stagger 30]

``bin/prod`` (webserver + daemon) on a fresh PostgreSQL instance and store, the provider
simulator at ``--rpm``. Each size is one new tenant of that many posts, imported, then launched
through the webserver's GraphQL API (``launchPartitionBackfill`` of labels + apply, as the UI's
launch dialog does) and waited for. Where the time went comes from the instance's own records:
the backfill's timestamps, its runs' create, start and end times, and their events. Each
launch waits a random 0..``--stagger`` s first (the same draws for every settings in a round):
launched at once, it would follow the previous backfill's close, i.e. a look of the backfill
daemon, by a few seconds and wait nearly a whole interval for the next.

  tick      launch -> first run created          (the backfill daemon's next look)
  queue     created -> dequeued                  (the run queue's next dequeue)
  start     dequeued -> RUN_START                (run worker process: code loaded, instance open)
  step      RUN_START -> first step started
  labels    first step -> last label stored      (the sending, ideally posts / RPM * 60 s)
  apply     last label -> last apply stored
  end       last apply -> last run ended
  close     last run ended -> backfill closed    (the backfill daemon's next look)

``--settings``: ``default`` is the shipped ``deploy/dagster.postgres.yaml`` with every daemon
timing setting removed (Dagster's own: backfills looked at every 30 s, runs dequeued every
5 s); ``tuned`` is the file as shipped. Rounds alternate the settings. Medians per size; the
last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.common import ROOT, clean_env, drop_store, median, new_store
from bench.shared_limit_bench import _start_sim

PROD_YAML = ROOT / "deploy" / "dagster.postgres.yaml"
PHASES = ("tick", "queue", "start", "step", "labels", "apply", "end", "close")
TERMINAL = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}


def instance_yaml(settings: str) -> str:
    """The instance file for ``settings`` (see the module's docstring)."""
    text = PROD_YAML.read_text()
    if settings == "tuned":
        return text
    doc: dict[str, Any] = yaml.safe_load(text)
    doc.pop("backfill_daemon", None)
    doc.pop("backfills", None)
    doc.pop("sensors", None)
    coordinator = doc.get("run_coordinator", {}).get("config", {})
    for key in [k for k in coordinator if k.startswith("dequeue_")]:
        coordinator.pop(key)
    doc.get("run_monitoring", {}).pop("poll_interval_seconds", None)
    return yaml.safe_dump(doc, sort_keys=False)


def _gql_ready(base: str) -> bool:
    query = '{ assetNodeOrError(assetKey: {path: ["moderation_labels"]}) { __typename } }'
    try:
        doc = httpx.post(f"{base}/graphql", json={"query": query}, timeout=5).json()
        return bool(doc["data"]["assetNodeOrError"]["__typename"] == "AssetNode")
    except (httpx.HTTPError, KeyError, TypeError, ValueError):
        return False


def _cli(args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "backfill_assets.cli", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{args} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def phases(home: Path, backfill_id: str, launched: float) -> dict[str, float]:
    """Seconds per phase of one backfill, from the instance's records (see the docstring)."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        backfill = instance.get_backfill(backfill_id)
        assert backfill is not None and backfill.backfill_end_timestamp is not None
        records = instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
        assert records, f"backfill {backfill_id} has no runs"
        created = min(r.create_timestamp.timestamp() for r in records)
        ended = max(r.end_time or 0.0 for r in records)
        stamps: dict[str, list[float]] = {}
        for r in records:
            for e in instance.all_logs(r.dagster_run.run_id):
                ev = e.dagster_event
                if ev is None:
                    continue
                name = ev.event_type_value
                if ev.is_step_materialization and ev.asset_key is not None:
                    name = f"mat:{ev.asset_key.to_user_string()}"
                stamps.setdefault(name, []).append(e.timestamp)
    first = {k: min(v) for k, v in stamps.items()}
    last = {k: max(v) for k, v in stamps.items()}
    # The run queue's dequeue: its event, or else the launcher's (it follows at once).
    dequeued = first.get("PIPELINE_DEQUEUED", first.get("PIPELINE_STARTING", created))
    started = first["PIPELINE_START"]
    labelled, applied = last["mat:moderation_labels"], last["mat:applied_labels"]
    return {
        "tick": created - launched,
        "queue": dequeued - created,
        "start": started - dequeued,
        "step": first["STEP_START"] - started,
        "labels": labelled - first["STEP_START"],
        "apply": applied - labelled,
        "end": ended - applied,
        "close": backfill.backfill_end_timestamp - ended,
        "to_applied": applied - launched,
        "to_closed": backfill.backfill_end_timestamp - launched,
    }


def one_round(settings: str, sizes: list[int], args: argparse.Namespace, sim_url: str, work: Path, r: int) -> dict[int, dict[str, float]]:  # fmt: skip
    """bin/prod with ``settings``; one tenant a size, launched and waited for in turn."""
    rpm = args.rpm
    draws = random.Random(r)
    from backfill_assets.runner.launch import DagsterClient, by_tenant, select_partitions

    home = work / f"home-{settings}-{r}"
    home.mkdir()
    (home / "dagster.yaml").write_text(instance_yaml(settings))
    instance_url = new_store("pg", work, prefix="bf_daemon_i_")
    store_url = new_store("pg", work, prefix="bf_daemon_s_").replace(
        "postgresql+psycopg2://", "postgresql://", 1
    )
    port = _port()
    base = f"http://127.0.0.1:{port}"
    env = clean_env(
        DAGSTER_PG_URL=instance_url, BACKFILL_DATABASE_URL=store_url, DAGSTER_HOME=str(home),
        HOST="127.0.0.1", PORT=str(port), STOP_GRACE_SECONDS="20",
        BACKFILL_MODEL_BACKEND="openai", BACKFILL_MODEL="gpt-4o-mini",
        BACKFILL_MODEL_BASE_URL=sim_url, BACKFILL_RPM=str(rpm), BACKFILL_CONCURRENCY="64",
    )  # fmt: skip
    os.environ["DAGSTER_PG_URL"] = instance_url  # this process reads the instance too
    log = work / f"prod-{settings}-{r}.log"
    with log.open("wb") as fh:
        prod = subprocess.Popen(
            [str(ROOT / "bin" / "prod")], env=env, cwd=ROOT, stdout=fh,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    out: dict[int, dict[str, float]] = {}
    client = DagsterClient(base)
    try:
        deadline = time.monotonic() + 180
        while not _gql_ready(base):
            if prod.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bin/prod did not come up:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        for n in sizes:
            tenant = f"daemon-{n}"
            export = work / f"{tenant}-{settings}-{r}.jsonl"
            with export.open("w") as fh2:
                for i in range(n):
                    text = f"{tenant} post {i}: arrived on time, works as described"
                    fh2.write(json.dumps({"tenant_id": tenant, "post_id": f"p{i}", "text": text}))
                    fh2.write("\n")
            _cli(["import", str(export)], env)
            keys = by_tenant(select_partitions(client.partition_state(), missing=True))[tenant]
            time.sleep(draws.uniform(0, args.stagger))
            launched = time.time()
            backfill_id = client.launch_backfill(keys, f"bench {tenant}", {"tenant": tenant})
            status = ""
            while status not in TERMINAL:
                if time.time() - launched > 900 or prod.poll() is not None:
                    raise RuntimeError(f"{tenant}: backfill {status}\n{log.read_text()[-3000:]}")
                time.sleep(0.25)
                status = client.backfill_status(backfill_id)
            if status != "COMPLETED_SUCCESS":
                raise RuntimeError(f"{tenant}: backfill {status}\n{log.read_text()[-3000:]}")
            out[n] = phases(home, backfill_id, launched)
            out[n]["partitions"] = len(keys)
            shown = " ".join(f"{k} {v:.1f}" for k, v in out[n].items())
            print(f"  {settings} round {r + 1}, {n} posts: {shown}", flush=True)
    finally:
        client.close()
        _stop(prod)
        drop_store(instance_url)
        drop_store(store_url)
    return out


def main() -> None:
    """Rounds of every settings, alternating; medians per size side by side with the ideal."""
    p = argparse.ArgumentParser(prog="bench/run daemon")
    p.add_argument("--sizes", default="10,100,1200", help="posts per backfill, comma-separated")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--settings", default="default,tuned", help="default, tuned or both")
    p.add_argument("--rpm", type=int, default=600)
    p.add_argument("--latency-ms", type=float, default=200.0)
    p.add_argument("--stagger", type=float, default=30.0, help="random wait before a launch")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    chosen = [s for s in args.settings.split(",") if s]
    if not chosen or set(chosen) - {"default", "tuned"}:
        p.error("--settings: default, tuned or default,tuned")
    got: dict[str, dict[int, list[dict[str, float]]]] = {s: {n: [] for n in sizes} for s in chosen}
    with tempfile.TemporaryDirectory(prefix="bench-daemon-") as tmp:
        sim, sim_url = _start_sim(args.rpm, args.latency_ms)
        try:
            for r in range(args.rounds):
                for s in chosen if r % 2 == 0 else chosen[::-1]:
                    for n, figs in one_round(s, sizes, args, sim_url, Path(tmp), r).items():
                        got[s][n].append(figs)
        finally:
            sim.terminate()
    med = {
        s: {n: {k: median([f[k] for f in runs]) for k in runs[0]} for n, runs in by.items()}
        for s, by in got.items()
    }
    print(f"\nmedians of {args.rounds} round(s), {args.rpm} RPM; seconds per phase")
    print(f"{'settings':<9}{'posts':>6}" + "".join(f"{k:>8}" for k in PHASES))
    for s in chosen:
        for n in sizes:
            print(f"{s:<9}{n:>6}" + "".join(f"{med[s][n][k]:>8.1f}" for k in PHASES))
    print("\nlaunch -> applied (-> backfill closed), beside the ideal posts / RPM * 60")
    print(f"{'posts':>6}{'ideal':>8}" + "".join(f"{s:>22}" for s in chosen))
    for n in sizes:
        cells = "".join(
            f"{med[s][n]['to_applied']:>11.1f} ({med[s][n]['to_closed']:>6.1f})" + " " * 3
            for s in chosen
        )
        print(f"{n:>6}{n / args.rpm * 60:>8.1f}   {cells}")
    doc = {"rpm": args.rpm, "rounds": args.rounds, "medians": med}
    print(json.dumps(doc), flush=True)


if __name__ == "__main__":
    main()
