"""The Dagster UI as the operator's console, driven in headless Chromium against ``dagster dev``.

Everything is launched through the UI itself (the lineage view's "Materialize all" dialog, with
the group filtered to ``moderation``): a backfill of one tenant's partitions, then one tenant
slice. GraphQL is only used to wait for completion and to cross-check what the page shows.
Screenshots go to ``artifacts/screenshots/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from backfill_assets.cli import main as cli_main
from backfill_tests.cli_runs import last_json
from backfill_tests.dagster_dev import ROOT, DagsterDev, dagster_dev
from bench.common import keep_community_dialog_shut

# One worker runs the tests that start servers or time a stop, one after another (bin/test).
pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("servers")]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = ROOT / "artifacts" / "screenshots"
# The lineage view filtered to the moderation group: moderation_labels and applied_labels.
GROUP_VIEW = "/asset-groups~group%3A%22moderation%22/"
# The demo's tenants hold 200 posts each; at 50 posts a partition, each has four (s00..s03).
SLICE_TARGET = "50"
TENANT, SLICE = "acme", "s00"
SHADOW_LABELS = sa.text(
    "SELECT post_id, moderation_label_shadow FROM posts WHERE tenant_id = :t ORDER BY post_id"
)

playwright_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagsterDev]:
    if not CHROMIUM.exists():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("CI=true but /usr/bin/chromium is missing (apt-get install chromium)")
        pytest.skip("no /usr/bin/chromium")
    extra = {"BACKFILL_SLICE_TARGET_POSTS": SLICE_TARGET}
    with dagster_dev(tmp_path_factory.mktemp("browser"), extra_env=extra) as running:
        yield running


@pytest.fixture
def page(dev: DagsterDev) -> Iterator[Any]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        pg = browser.new_page(viewport={"width": 1800, "height": 1000})
        pg.set_default_timeout(30_000)
        keep_community_dialog_shut(pg)
        try:
            yield pg
        finally:
            with contextlib.suppress(playwright_api.Error):
                shot(pg, "last.png")  # what the page showed at the end, pass or fail
            browser.close()


def goto(pg: Any, dev: DagsterDev, path: str) -> None:
    pg.goto(dev.base_url + path)
    pg.wait_for_load_state("networkidle")


def shot(pg: Any, name: str) -> None:
    pg.screenshot(path=str(SHOTS / name))


def pick(pg: Any, dialog: Any, value: str, every: bool = False) -> None:
    """Choose the partition ``value`` in the launch dialog, or with ``every`` all partitions
    whose key contains it (a tenant's: the selector's filter, then its "Select all")."""
    dialog.locator("[class*=TagSelector_tagSelectorContainer]").click()
    pg.keyboard.type(value)
    wanted = re.compile(r"^Select all \(\d+\)" if every else f"^{re.escape(value)}")
    item = pg.get_by_role("menuitem").filter(has_text=wanted)
    # The suggestion list re-renders while it filters; an item can detach between being
    # found and being clicked, so retry a few short clicks instead of one long one.
    for attempt in range(6):
        try:
            item.last.click(timeout=5_000)
            break
        except playwright_api.Error:
            if attempt == 5:
                raise
            pg.wait_for_timeout(300)
    dialog.get_by_text("Launch runs to materialize").click()  # close the popover


def open_check_partitions(pg: Any, dev: DagsterDev, check: str) -> None:
    """The check's own Partitions tab (the asset has one too: wait for the check's panel)."""
    goto(pg, dev, f"/assets/moderation_labels?view=checks&checkDetail={check}")
    pg.get_by_role("tab", name="Execution history").wait_for()
    pg.get_by_role("tab", name="Partitions").last.click()


def open_launch_dialog(pg: Any, dev: DagsterDev) -> Any:
    goto(pg, dev, GROUP_VIEW)
    pg.get_by_role("button", name="Materialize all…").click()
    # posts was imported by the CLI, which records it as materialised: no "upstream never
    # materialised" confirmation comes up.
    dialog = pg.locator(".dagster-dialog")
    dialog.get_by_text("Launch runs to materialize 2 assets").wait_for()
    return dialog


def wait_backfill(dev: DagsterDev, backfill_id: str, timeout: float = 240) -> str:
    q = """query($id: String!) { partitionBackfillOrError(backfillId: $id) {
      ... on PartitionBackfill { status } } }"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = str(dev.gql(q, {"id": backfill_id})["partitionBackfillOrError"]["status"])
        if status not in ("REQUESTED", "CANCELING", "FAILING"):
            return status
        time.sleep(1)
    raise AssertionError(f"backfill {backfill_id} still running after {timeout}s")


def wait_backfill_runs(dev: DagsterDev, backfill_id: str, timeout: float = 240) -> list[str]:
    """Statuses of a backfill's runs once all have finished (the daemon marks the backfill
    itself done on its next 30 s tick, which the test does not wait for here)."""
    q = """query($id: String!) {
      runsOrError(filter: {tags: [{key: "dagster/backfill", value: $id}]}) {
        ... on Runs { results { status } } } }"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = dev.gql(q, {"id": backfill_id})["runsOrError"]["results"]
        statuses = [str(r["status"]) for r in runs]
        if statuses and all(s in ("SUCCESS", "FAILURE", "CANCELED") for s in statuses):
            return statuses
        time.sleep(1)
    raise AssertionError(f"backfill {backfill_id} runs still running after {timeout}s")


def run_ids(dev: DagsterDev, partition: str | None = None) -> set[str]:
    """Every run's id, or only those of one partition (the daemon may start others meanwhile:
    a backfill launched earlier, the reporting refreshes)."""
    where = f'(filter: {{tags: [{{key: "dagster/partition", value: "{partition}"}}]}})'
    query = "{ runsOrError%s { ... on Runs { results { runId } } } }" % (where if partition else "")
    runs = dev.gql(query)
    return {r["runId"] for r in runs["runsOrError"]["results"]}


def wait_new_run(dev: DagsterDev, before: set[str], partition: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = run_ids(dev, partition) - before
        if new:
            assert len(new) == 1, new
            return new.pop()
        time.sleep(0.5)
    raise AssertionError("the launch dialog started no run")


def wait_run(dev: DagsterDev, run_id: str, timeout: float = 240) -> str:
    q = "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = str(dev.gql(q, {"id": run_id})["runOrError"]["status"])
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            return status
        time.sleep(1)
    raise AssertionError(f"run {run_id} still running after {timeout}s")


def check_statuses(dev: DagsterDev, partition: str) -> dict[str, str]:
    q = """query { assetNodeOrError(assetKey: {path: ["moderation_labels"]}) { ... on AssetNode {
      assetChecksOrError { ... on AssetChecks { checks { name } } } } } }"""
    names = [c["name"] for c in dev.gql(q)["assetNodeOrError"]["assetChecksOrError"]["checks"]]
    out = {}
    for name in names:
        ex = dev.gql(
            'query($n: String!) { assetCheckExecutions(assetKey: {path: ["moderation_labels"]},'
            " checkName: $n, limit: 100) { partition status } }",
            {"n": name},
        )["assetCheckExecutions"]
        out[name] = next(e["status"] for e in ex if e["partition"] == partition)
    return out


def wait_materialized(dev: DagsterDev, asset: str, timeout: float = 180) -> bool:
    """Whether an unpartitioned asset gets materialised within ``timeout`` (the daemon's
    automation sensor ticks every 30 s)."""
    q = """query($p: [String!]!) { assetNodeOrError(assetKey: {path: $p}) {
      ... on AssetNode { assetMaterializations(limit: 1) { runId } } } }"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if dev.gql(q, {"p": [asset]})["assetNodeOrError"]["assetMaterializations"]:
            return True
        time.sleep(2)
    return False


def applied_run(dev: DagsterDev, partition: str) -> str | None:
    q = """query($p: [String!]) { assetNodeOrError(assetKey: {path: ["applied_labels"]}) {
      ... on AssetNode { latestMaterializationByPartition(partitions: $p) { runId } } } }"""
    mats = dev.gql(q, {"p": [partition]})["assetNodeOrError"]["latestMaterializationByPartition"]
    return mats[0]["runId"] if mats and mats[0] else None


def launch_cli(capsys: pytest.CaptureFixture[str], dev: DagsterDev, *flags: str) -> dict[str, Any]:
    capsys.readouterr()  # drop earlier output
    # The same store and instance as the webserver: launch applies run's skip rule.
    with pytest.MonkeyPatch.context() as mp:
        for k, v in dev.env.items():
            mp.setenv(k, v)
        code = cli_main(["launch", *flags, "--json", "--url", dev.base_url])
    out = capsys.readouterr().out
    assert code == 0, out
    doc: dict[str, Any] = last_json(out)
    return doc


def test_operator_console(page: Any, dev: DagsterDev, capsys: pytest.CaptureFixture[str]) -> None:
    pg = page
    goto(pg, dev, "/assets/moderation_labels?view=partitions")
    pg.get_by_text("Missing (12)").wait_for()  # 3 tenants x 4: only partitions that hold posts
    # Dagster's community dialog (a second after a first visit) stays shut: see ``page``.
    pg.wait_for_timeout(1_500)
    assert pg.get_by_text("Join the Dagster community").count() == 0
    shot(pg, "01-partitions-missing.png")

    # 1. A backfill of one tenant's partitions, through the launch dialog.
    dialog = open_launch_dialog(pg, dev)
    pick(pg, dialog, TENANT, every=True)  # the tenant's partitions: filter, "Select all"
    dialog.get_by_text("4 partitions", exact=True).wait_for()
    shot(pg, "02-launch-dialog.png")
    dialog.get_by_role("button", name="Launch backfill").click()
    toast = pg.get_by_text(re.compile(r"Created backfill [a-z]+"))
    toast.wait_for()
    found = re.search(r"Created backfill ([a-z]+)", toast.inner_text())
    assert found is not None
    backfill_id = found.group(1)
    # One run: the backfill policy puts a tenant's consecutive partitions into one range run.
    assert wait_backfill_runs(dev, backfill_id) == ["SUCCESS"]

    goto(pg, dev, "/assets/moderation_labels?view=partitions")
    pg.get_by_text("Materialized (4)").wait_for()
    pg.get_by_text("Missing (8)").wait_for()
    shot(pg, "04-partitions-grid.png")
    pk = f"{SLICE}|{TENANT}"
    assert set(check_statuses(dev, pk).values()) == {"SUCCEEDED"}
    backfill_apply = applied_run(dev, pk)
    assert backfill_apply is not None

    goto(pg, dev, "/assets/moderation_labels?view=checks")
    pg.get_by_text("integrity", exact=True).first.wait_for()
    shot(pg, "05-checks-passed.png")

    # The launch command computes the same picture from the webserver's GraphQL API; every
    # partition holds posts, so it leaves nothing out.
    missing = launch_cli(capsys, dev, "--missing", "--failed", "--stale", "--dry-run")
    assert missing["partitions"] == 8 and missing["left_out"] == 0
    assert {b["tenant"] for b in missing["backfills"]} == {"globex", "initech"}
    # ... and launches it: one asset backfill per tenant, tagged with the tenant. It runs
    # while the rest of the test goes on.
    (launched,) = launch_cli(capsys, dev, "--missing", "--tenant", "initech")["backfills"]
    assert launched["partitions"] == [f"s0{i}|initech" for i in range(4)]

    # 2. Tamper: one of acme's results now claims to be globex's.
    engine = sa.create_engine(f"sqlite:///{dev.store_path}")
    with engine.begin() as conn:
        key = conn.execute(
            # A result of the partition s00 (stored slice mod 4 == 0 at four partitions).
            sa.text("SELECT key FROM results WHERE tenant_id = :t AND slice % 4 = 0 LIMIT 1"),
            {"t": TENANT},
        ).scalar_one()
        conn.execute(sa.text("UPDATE results SET tenant_id = 'globex' WHERE key = :k"), {"k": key})
        shadow_before = conn.execute(
            SHADOW_LABELS,
            {"t": TENANT},
        ).all()
    engine.dispose()

    # 3. Materialise that one tenant slice from the UI: the run fails on isolation.
    dialog = open_launch_dialog(pg, dev)
    pick(pg, dialog, pk)
    dialog.get_by_text("1 partition", exact=True).wait_for()
    before = run_ids(dev, pk)
    dialog.get_by_role("button", name=re.compile("^Launch")).click()
    run_id = wait_new_run(dev, before, pk)
    assert wait_run(dev, run_id) == "FAILURE"

    statuses = check_statuses(dev, pk)
    assert statuses == {"integrity": "FAILED"}, statuses
    # applied_labels did not run: its latest materialisation is still the backfill's.
    assert applied_run(dev, pk) == backfill_apply

    goto(pg, dev, f"/runs/{run_id}")
    pg.get_by_text("Dependencies for step applied_labels failed").first.wait_for()
    shot(pg, "06-run-blocked.png")
    open_check_partitions(pg, dev, "integrity")
    # Per-partition check status: the tampered slice failed, acme's other 3 passed.
    pg.get_by_text("Failed (1)", exact=True).wait_for()
    # acme's 3 others plus initech's 4, once the CLI-launched backfill's run has finished.
    assert wait_backfill_runs(dev, launched["backfill_id"]) == ["SUCCESS"]
    open_check_partitions(pg, dev, "integrity")
    pg.get_by_text("Failed (1)", exact=True).wait_for()
    pg.get_by_text("Passed (7)", exact=True).wait_for()
    shot(pg, "07-isolation-partitions.png")
    # The tampered partition's evaluation: counts, the offending key, the command to inspect.
    pg.get_by_text(pk, exact=True).first.click()
    # Which member check failed and why, the offending key and the command to list them all.
    pg.get_by_text("isolation: 1 row(s) failed isolation").first.wait_for()
    pg.get_by_text(f"row tenant 'globex' is not '{TENANT}'").first.wait_for()
    inspect = f"backfill-moderation check --tenant {TENANT} --slice {SLICE} --name isolation"
    pg.get_by_text(inspect).first.wait_for()
    shot(pg, "08-isolation-failed.png")

    check_failed = launch_cli(capsys, dev, "--check-failed", "--dry-run")
    assert [b["partitions"] for b in check_failed["backfills"]] == [[pk]]

    engine = sa.create_engine(f"sqlite:///{dev.store_path}")
    with engine.connect() as conn:
        shadow_after = conn.execute(
            SHADOW_LABELS,
            {"t": TENANT},
        ).all()
    engine.dispose()
    assert shadow_after == shadow_before
    # By now the backfill daemon has ticked again and closed the first backfill.
    assert wait_backfill(dev, backfill_id) == "COMPLETED_SUCCESS"
    assert wait_backfill_runs(dev, launched["backfill_id"]) == ["SUCCESS"]
    tags = dev.gql(
        """query($id: String!) {
          runsOrError(filter: {tags: [{key: "dagster/backfill", value: $id}]}) {
            ... on Runs { results { tags { key value } } } } }""",
        {"id": launched["backfill_id"]},
    )["runsOrError"]["results"][0]["tags"]
    assert {"key": "tenant", "value": "initech"} in tags

    # 4. Before launching, the cost: backfill_plan, refreshed by the daemon after the import.
    assert wait_materialized(dev, "backfill_plan")
    goto(pg, dev, "/assets/backfill_plan")
    pg.get_by_text("reserved_bound_tokens").first.wait_for()
    pg.get_by_text("pending_keys").first.wait_for()
    shot(pg, "09-backfill-plan.png")


def test_one_tenant_among_ten_thousand_is_found_and_launched_from_the_ui(
    page: Any, dev: DagsterDev, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """At 10,000 more tenants (one post each, 10,000 more partitions), the launch dialog's
    partition selector still finds one tenant's by typing, and it runs from the UI."""
    export = tmp_path / "many.jsonl"
    with export.open("w") as fh:
        for i in range(10_000):
            fh.write(json.dumps({"tenant_id": f"t{i:05d}", "post_id": "p1", "text": f"hi {i}"}))
            fh.write("\n")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in dev.env.items():
            mp.setenv(k, v)
        assert cli_main(["import", str(export)]) == 0
    capsys.readouterr()
    pg = page
    tenant, pk = "t09999", "s00|t09999"
    started = time.monotonic()
    dialog = open_launch_dialog(pg, dev)
    pick(pg, dialog, tenant, every=True)
    dialog.get_by_text("1 partition", exact=True).wait_for()
    print(f"launch dialog, tenant found among 10,003: {time.monotonic() - started:.1f} s")
    shot(pg, "09-one-tenant-of-10000.png")
    before = run_ids(dev, pk)
    dialog.get_by_role("button", name=re.compile("^Launch")).click()
    run_id = wait_new_run(dev, before, pk)
    assert wait_run(dev, run_id) == "SUCCESS"
    assert set(check_statuses(dev, pk).values()) == {"SUCCEEDED"}
    assert applied_run(dev, pk) == run_id
