"""Operator commands: ``check`` (one partition's checks, offending keys) and ``launch``."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from backfill_assets.cli.inputs import choice, known_tenants, require_gate, slice_key, store_tenants
from backfill_assets.cli.numbers import count, seconds
from backfill_assets.cli.tables import Human, emit, table, tell
from backfill_assets.domain.checks.catalog import CHECK_GROUPS, CHECK_NAMES, CheckResult
from backfill_assets.domain.errors import UserError
from backfill_assets.domain.urls import redact_url, scrub
from backfill_assets.domain.work import SLICE_KEYS, run_tags

if TYPE_CHECKING:
    from backfill_assets.config.settings import Settings
    from backfill_assets.runner.api import DagsterClient

# ``launch --wait``: longer than a week is not waiting on a backfill, it is forgetting one.
MAX_WAIT_SECONDS = 7 * 86_400


def add_operator_commands(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Register ``check`` and ``launch``."""
    sp = add("check", "Run the partition checks of moderation_labels and list offending keys.")
    sp.add_argument("--tenant", action="append", default=[], help="tenant id (repeatable)")
    sp.add_argument(
        "--summary",
        action="store_true",
        help="per partition, what Dagster recorded: which check groups passed, failed or never "
        "ran (all tenants unless --tenant)",
    )
    sp.add_argument(
        "--slice",
        action="append",
        default=[],
        type=slice_key,
        help="slice, s03 or 3 (repeatable; default all)",
    )
    sp.add_argument(
        "--name",
        action="append",
        default=[],
        type=choice("check", CHECK_NAMES),
        help=f"check (repeatable): {', '.join(CHECK_NAMES)}",
    )
    sp.add_argument(
        "--limit",
        type=count(0, 10**6),
        default=50,
        help="offending keys listed per check, 0 to 1,000,000",
    )
    sp.set_defaults(func=cmd_check)

    sp = add("launch", "Launch Dagster backfills of stale/missing/failed partitions (GraphQL).")
    sp.add_argument("--stale", action="store_true", help="partitions with a new code version")
    sp.add_argument("--missing", action="store_true", help="never materialised partitions")
    sp.add_argument("--failed", action="store_true", help="partitions whose last run failed")
    sp.add_argument(
        "--check-failed", action="store_true", help="partitions with a failed blocking check"
    )
    sp.add_argument("--tenant", action="append", default=[], help="limit to tenant (repeatable)")
    sp.add_argument("--url", default="", help="webserver URL (default $DAGSTER_WEBSERVER_URL)")
    sp.add_argument("--dry-run", action="store_true", help="print the selection, launch nothing")
    sp.add_argument(
        "--wait",
        type=seconds(MAX_WAIT_SECONDS),
        default=0.0,
        help="seconds to wait for completion, 0 to 604,800 (a week)",
    )
    sp.set_defaults(func=cmd_launch)


def _check_result_doc(pk: str, v: CheckResult) -> dict[str, Any]:
    return {
        "partition": pk,
        "check": v.name,
        "passed": v.passed,
        "blocking": v.blocking,
        "severity": "WARN" if v.warn else "ERROR",
        "summary": v.summary,
        "counts": v.counts,
        "offending": list(v.sample_keys),
    }


def cmd_check(args: argparse.Namespace, settings: Settings) -> int:
    """The same checks Dagster runs, for one tenant's partitions; exit 1 on blocking failures."""
    from backfill_assets.runner.api import (
        check_results_for,
        partition_key_for,
        partition_ref,
        with_levels,
    )
    from backfill_assets.runner.queries import store_engine

    if not args.summary and len(args.tenant) != 1:
        raise UserError("check needs exactly one --tenant (or --summary for an overview)")
    engine = store_engine(settings.store)
    if args.summary:
        return _check_summary(args, settings, engine)
    tenant = store_tenants(engine, args.tenant)[0]
    slices = args.slice or list(SLICE_KEYS)
    names = [n for n in CHECK_NAMES if n in args.name] or list(CHECK_NAMES)
    versions, rubric, checks = settings.versions(), settings.rubric(), settings.checks
    docs = []
    for s in slices:
        pk = partition_key_for(tenant, s)
        ref = with_levels(engine, [partition_ref(pk)])[0]
        for v in check_results_for(engine, ref, versions, rubric, checks, names, sample=args.limit):
            docs.append(_check_result_doc(pk, v))
    blocked = [d for d in docs if d["blocking"] and not d["passed"]]
    lines = []
    for d in docs:
        if d["passed"] and len(slices) > 1 and not args.name:
            continue  # a full sweep lists only what needs attention
        mark = "ok  " if d["passed"] else ("FAIL" if d["severity"] == "ERROR" else "WARN")
        lines.append(f"{mark} {d['partition']} {d['check']}: {d['summary']}")
        lines += [f"     {x}" for x in d["offending"]]
    passed = sum(1 for d in docs if d["passed"])
    lines.append(f"{passed}/{len(docs)} check(s) passed; {len(blocked)} blocking failure(s)")
    emit(args, {"ok": not blocked, "checks": docs}, "\n".join(lines))
    return 1 if blocked else 0


def _check_summary(args: argparse.Namespace, settings: Settings, engine: Any) -> int:
    """Per partition that holds posts: each check group's latest status in the instance."""
    from backfill_assets.runner.api import (
        BLOCKING_GROUPS,
        CHECK_STATES,
        check_status,
        instance,
        partition_key_for,
        partition_ref,
        with_levels,
    )

    tenants = store_tenants(engine, args.tenant)
    refs = [
        ref
        for ref in with_levels(
            engine,
            [partition_ref(partition_key_for(t, s)) for t in tenants for s in SLICE_KEYS],
        )
        if ref.slices
    ]
    if args.slice:
        refs = [r for r in refs if f"s{r.slice:02d}" in args.slice]
    status = check_status(instance(settings), [r.key for r in refs])
    rows = [{"partition": r.key, **status[r.key]} for r in refs]
    groups = [g.name for g in CHECK_GROUPS]
    counts = {g: {s: sum(1 for r in rows if r[g] == s) for s in CHECK_STATES} for g in groups}
    doc = {"partitions": rows, "counts": counts}
    failed = [r for r in rows if any(r[g] == "failed" for g in groups if g in BLOCKING_GROUPS)]
    lines: list[Human] = [table(rows, ["partition", *groups])]
    for g in groups:
        lines.append(f"{g}: " + ", ".join(f"{n} {s}" for s, n in counts[g].items() if n))
    emit(args, doc, *lines)
    return 1 if failed else 0


def cmd_launch(args: argparse.Namespace, settings: Settings) -> int:
    """Compute the partition list, then launch one backfill per tenant through GraphQL."""
    from backfill_assets.runner.api import DagsterClient, GraphQLError

    if not (args.stale or args.missing or args.failed or args.check_failed):
        raise UserError("choose at least one of --stale, --missing, --failed, --check-failed")
    if not args.dry_run:
        # The runs it launches send and book (the code location checks it too).
        settings.require_price()
        require_gate(settings)
    url = args.url or settings.store.webserver_url
    client = DagsterClient(url)
    try:
        return _launch(args, client, _no_work(settings), _regions(settings))
    except GraphQLError as exc:
        raise UserError(f"webserver: {scrub(str(exc), url)}") from None
    finally:
        client.close()


def _no_work(settings: Settings) -> dict[str, str]:
    """Partitions ``run`` would skip, with why (the same rule: plan.py), from the store and the
    local instance: no posts, or nothing to do. Tenants the store does not know are not
    judged (kept), so a launch from a host without the store launches what the UI shows."""
    from backfill_assets.runner.api import instance, make_plan, sink_of
    from backfill_assets.runner.queries import store_engine

    engine = store_engine(settings.store)
    sink = sink_of(settings.data)
    plan = make_plan(
        engine,
        instance(settings),
        settings.versions(),
        sink_id=None if sink is None else sink.sink_id,
    )
    return {p.ref.key: p.reason for p in plan.partitions if not p.run}


def _regions(settings: Settings) -> dict[str, str | None]:
    """Every tenant's region, for the backfills' ``region`` tags."""
    from backfill_assets.runner.queries import all_regions, read_tx, store_engine

    with read_tx(store_engine(settings.store)) as conn:
        return all_regions(conn)


def _launch(
    args: argparse.Namespace,
    client: DagsterClient,
    skip: dict[str, str],
    regions: dict[str, str | None],
) -> int:
    from backfill_assets.runner.api import by_tenant, partition_ref, select_partitions

    state = client.partition_state()
    # The tenants the webserver has partitions for: what a backfill can be launched for.
    tenants = known_tenants(args.tenant, sorted({partition_ref(k).tenant_id for k in state.keys}))
    selected = select_partitions(
        state, args.stale, args.missing, args.failed, args.check_failed, tenants
    )
    # Same rule as ``run``: partitions that hold no posts, or have nothing pending and are
    # materialised, checked and applied at this code version, are left out.
    keys = [k for k in selected if k not in skip]
    kinds = [k for k in ("stale", "missing", "failed", "check_failed") if getattr(args, k)]
    groups = by_tenant(keys)
    launched: list[dict[str, Any]] = []
    for tenant, pks in sorted(groups.items()):
        # The backfill's tags go on each of its runs: per-tenant and per-region queue limits.
        tags = {"tenant": tenant, **run_tags([regions.get(tenant)])}
        entry: dict[str, Any] = {"tenant": tenant, "partitions": pks, "tags": tags}
        if not args.dry_run:
            title = f"moderation {tenant}: {'+'.join(kinds)} ({len(pks)} partitions)"
            bid = client.launch_backfill(pks, title, tags)
            entry.update(backfill_id=bid, url=redact_url(client.backfill_url(bid)))
        launched.append(entry)
    statuses = _wait(client, launched, args.wait) if args.wait and not args.dry_run else {}
    for entry in launched:
        if "backfill_id" in entry:
            entry["status"] = statuses.get(entry["backfill_id"], "REQUESTED")
    doc = {
        "selection": kinds,
        "partitions": len(keys),
        "left_out": len(selected) - len(keys),
        "backfills": launched,
    }
    human = [
        f"{len(keys)} partition(s) selected ({', '.join(kinds)}); "
        f"{len(selected) - len(keys)} left out (no posts, or nothing to do)"
    ]
    for e in launched:
        where = e.get("url", "(dry run)")
        human.append(
            f"  {e['tenant']}: {len(e['partitions'])} partition(s) {where} {e.get('status', '')}"
        )
    emit(args, doc, "\n".join(human))
    failed = [s for s in statuses.values() if s not in ("COMPLETED", "COMPLETED_SUCCESS")]
    return 1 if failed else 0


def _wait(client: DagsterClient, launched: list[dict[str, Any]], seconds: float) -> dict[str, str]:
    from backfill_assets.runner.api import DONE_STATUSES

    deadline = time.monotonic() + seconds
    ids = [e["backfill_id"] for e in launched]
    statuses: dict[str, str] = {}
    while True:
        statuses = {bid: client.backfill_status(bid) for bid in ids}
        if all(s in DONE_STATUSES for s in statuses.values()) or time.monotonic() > deadline:
            return statuses
        tell(f"... {statuses}")
        time.sleep(2.0)
