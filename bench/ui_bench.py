"""The moderation_labels partitions page with many tenants, in headless Chromium.

    bench/run ui [--tenants 1000] [--posts-per-tenant 64] [--run-tenants 10] [--loads 5]

Imports ``tenants`` x ``posts-per-tenant`` posts with ``BACKFILL_SLICE_TARGET_POSTS=1`` (every
tenant splits into all 16 slices: 16,000 partitions for 1,000 tenants), runs the first
``run-tenants`` tenants so the page has materialised partitions too, starts
``dagster-webserver`` alone (no daemon) on that home, and times ``/assets/moderation_labels?
view=partitions`` from navigation until the partition counts ("Missing (N)") render:

- first: the first load after the webserver started (server and browser cold);
- cold: a new browser context each time (no HTTP cache), median of ``loads``;
- warm: a reload in the same context, median of ``loads``.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import tempfile
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx

from bench.common import ROOT, fmt, median
from bench.scale_bench import cli, cli_env, tenant_names, write_export

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
PAGE = "/assets/moderation_labels?view=partitions"
COUNTS = re.compile(r"^Missing \([\d,]+\)$")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_ready(base: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> float:
    t0 = time.perf_counter()
    query = '{ assetNodeOrError(assetKey: {path: ["moderation_labels"]}) { __typename } }'
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(log.read_text()[-3000:])
        with suppress(httpx.HTTPError):
            doc = httpx.post(f"{base}/graphql", json={"query": query}, timeout=10).json()
            if doc["data"]["assetNodeOrError"]["__typename"] == "AssetNode":
                return time.perf_counter() - t0
        time.sleep(0.25)
    raise RuntimeError(f"webserver not ready in {timeout} s:\n{log.read_text()[-3000:]}")


def _load(page: Any, url: str) -> tuple[float, str]:
    """Seconds from navigation until the counts render, and the counts shown."""
    t0 = time.perf_counter()
    page.goto(url, wait_until="commit")
    counts = page.get_by_text(COUNTS).first
    counts.wait_for(state="visible")
    elapsed = time.perf_counter() - t0
    return elapsed, str(counts.inner_text())


def _measure(base: str, loads: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    url = base + PAGE
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            cold: list[float] = []
            warm: list[float] = []
            shown = ""
            for _ in range(loads):
                ctx = browser.new_context(viewport={"width": 1800, "height": 1000})
                page = ctx.new_page()
                page.set_default_timeout(120_000)
                seconds, shown = _load(page, url)
                cold.append(seconds)
                warm.append(_load(page, url)[0])
                ctx.close()
        finally:
            browser.close()
    return {"first_s": cold[0], "cold": cold, "warm": warm, "shown": shown}


def main() -> None:
    """Build the instance, start the webserver, time the page."""
    p = argparse.ArgumentParser(
        prog="bench/run ui", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--tenants", type=int, default=1000)
    p.add_argument("--posts-per-tenant", type=int, default=64)
    p.add_argument("--run-tenants", type=int, default=10, help="tenants materialised first")
    p.add_argument("--loads", type=int, default=5)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="scale-ui-") as tmp:
        work = Path(tmp)
        home = work / "home"
        env = cli_env(home, f"sqlite:///{home / 'store.db'}", BACKFILL_SLICE_TARGET_POSTS="1")
        export = write_export(work / "posts.jsonl", a.tenants * a.posts_per_tenant, a.tenants)
        imported = cli(["import", str(export)], env)
        run_args = [f"--tenant={t}" for t in tenant_names(a.tenants)[: a.run_tenants]]
        ran = cli(["run", *run_args], env) if run_args else None
        print(
            f"# ui: {a.tenants:,} tenants x {a.posts_per_tenant} posts, slice target 1 "
            f"(16 partitions a tenant): import {imported.wall:.1f} s; "
            + (
                f"run of {a.run_tenants} tenants {ran.wall:.1f} s, "
                f"{len(ran.doc.get('runs', []))} Dagster run(s)"
                if ran
                else "nothing materialised"
            ),
            flush=True,
        )
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        log = work / "webserver.log"
        with log.open("wb") as fh:
            proc = subprocess.Popen(
                [
                    str(Path(ROOT / ".venv" / "bin" / "dagster-webserver")),
                    "-w",
                    str(ROOT / "workspace.yaml"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(port),
                ],
                cwd=ROOT,
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            ready = _wait_ready(base, proc, log, 180)
            got = _measure(base, a.loads)
        finally:
            proc.terminate()
            with suppress(subprocess.TimeoutExpired):
                proc.wait(15)
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    print(f"webserver ready after {ready:.1f} s; the page shows {got['shown']!r}")
    print(f"first load after start: {got['first_s']:.2f} s")
    print(f"cold (new browser context): {fmt(got['cold'], 's', 2)}")
    print(f"warm (reload): {fmt(got['warm'], 's', 2)} (target <= 5 s)")
    got["cold_median_s"] = median(got["cold"])
    got["warm_median_s"] = median(got["warm"])
    print(json.dumps(got), flush=True)


if __name__ == "__main__":
    main()
