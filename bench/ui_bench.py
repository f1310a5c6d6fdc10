"""The moderation_labels views an operator uses, with many tenants, in headless Chromium.

    bench/run ui [--tenants 1000] [--posts-per-tenant 64] [--run-tenants 10] [--loads 5]

Imports ``tenants`` x ``posts-per-tenant`` posts with ``BACKFILL_SLICE_TARGET_POSTS=1`` (a
tenant of 16 posts or more splits into all 16 slices: 16,000 partitions for 1,000 tenants of
64 posts; one post a tenant is one partition), runs the first ``run-tenants`` tenants so the
views have materialised and checked partitions too, starts ``dagster-webserver`` alone (no
daemon) on that home, and times:

- the partitions page (``/assets/moderation_labels?view=partitions``), from navigation until
  the partition counts ("Missing (N)") render: first (the first load after the webserver
  started), cold (a new browser context each time: no HTTP cache), warm (a reload);
- the launch dialog (lineage, group ``moderation``, "Materialize all..."), cold: from
  navigation until the dialog shows, and from typing the last tenant's id into its partition
  selector until that tenant's "Select all (1)" is offered;
- the ``integrity`` check's Partitions tab, cold: from navigation until its counts render.

Each a median of ``loads``.
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

from bench.common import ROOT, fmt, keep_community_dialog_shut, median
from bench.scale_bench import cli, cli_env, tenant_names, write_export

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
PAGE = "/assets/moderation_labels?view=partitions"
GROUP_VIEW = "/asset-groups~group%3A%22moderation%22/"
CHECK_PAGE = "/assets/moderation_labels?view=checks&checkDetail=integrity"
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


def _launch_dialog(page: Any, base: str, tenant: str) -> tuple[float, float]:
    """Seconds until the launch dialog shows, then from typing ``tenant`` until its partitions
    are offered."""
    t0 = time.perf_counter()
    page.goto(base + GROUP_VIEW, wait_until="commit")
    page.get_by_role("button", name="Materialize all…").click()
    dialog = page.locator(".dagster-dialog")
    dialog.get_by_text("Launch runs to materialize 2 assets").wait_for()
    opened = time.perf_counter() - t0
    t0 = time.perf_counter()
    dialog.locator("[class*=TagSelector_tagSelectorContainer]").click()
    page.keyboard.type(tenant)
    page.get_by_role("menuitem").filter(has_text=re.compile(r"^Select all \(1\)")).wait_for()
    return opened, time.perf_counter() - t0


def _check_tab(page: Any, base: str) -> float:
    """Seconds from navigation until the check's Partitions tab shows its counts."""
    t0 = time.perf_counter()
    page.goto(base + CHECK_PAGE, wait_until="commit")
    page.get_by_role("tab", name="Execution history").wait_for()
    page.get_by_role("tab", name="Partitions").last.click()
    page.get_by_text(COUNTS).first.wait_for(state="visible")
    return time.perf_counter() - t0


def _measure(base: str, loads: int, tenant: str) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    url = base + PAGE
    out: dict[str, list[float]] = {k: [] for k in ("cold", "warm", "dialog", "find", "check")}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            shown = ""
            for _ in range(loads):
                for view in ("page", "dialog", "check"):
                    ctx = browser.new_context(viewport={"width": 1800, "height": 1000})
                    page = ctx.new_page()
                    page.set_default_timeout(120_000)
                    keep_community_dialog_shut(page)  # it would cover what is timed
                    if view == "page":
                        seconds, shown = _load(page, url)
                        out["cold"].append(seconds)
                        out["warm"].append(_load(page, url)[0])
                    elif view == "dialog":
                        opened, found = _launch_dialog(page, base, tenant)
                        out["dialog"].append(opened)
                        out["find"].append(found)
                    else:
                        out["check"].append(_check_tab(page, base))
                    ctx.close()
        finally:
            browser.close()
    return {"first_s": out["cold"][0], **out, "shown": shown}


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
            f"# ui: {a.tenants:,} tenants x {a.posts_per_tenant} posts, slice target 1: "
            f"import {imported.wall:.1f} s; "
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
            got = _measure(base, a.loads, tenant_names(a.tenants)[-1])
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
    print(f"launch dialog, cold until shown: {fmt(got['dialog'], 's', 2)}")
    print(f"launch dialog, typing the last tenant until it is offered: {fmt(got['find'], 's', 2)}")
    print(f"integrity check's Partitions tab, cold: {fmt(got['check'], 's', 2)}")
    for k in ("cold", "warm", "dialog", "find", "check"):
        got[f"{k}_median_s"] = median(got[k])
    print(json.dumps(got), flush=True)


if __name__ == "__main__":
    main()
