"""The CLI commands. Each takes parsed args and the settings and returns an exit code."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from backfill_assets.cli.deadline import cmd_run_deadline
from backfill_assets.cli.inputs import UserError, known_tenants, load_user_policy, require_gate
from backfill_assets.cli.instance import instance
from backfill_assets.cli.run_processes import run_plan
from backfill_assets.cli.run_report import (
    HUMAN_COLUMNS,
    by_tenant,
    human_rows,
    run_document,
    skipped_line,
    totals_line,
)
from backfill_assets.cli.tables import Human, show, table
from backfill_assets.core.keys import slice_no
from backfill_assets.core.reconcile import ReportError, compare, read_report
from backfill_assets.core.rubric import Rubric
from backfill_assets.demo.generate import write_export
from backfill_assets.dispatch.partition_run import RunStopped
from backfill_assets.orchestration.canary import run_sample
from backfill_assets.orchestration.estimate import estimate_pending
from backfill_assets.orchestration.model_resources import versions_for
from backfill_assets.orchestration.orchestrate import refresh
from backfill_assets.orchestration.partitions import ensure_partitions
from backfill_assets.orchestration.plan import make_plan
from backfill_assets.orchestration.pooling import pool_by_region
from backfill_assets.orchestration.settings import Settings
from backfill_assets.orchestration.usage import REPRICE_COLUMNS, USAGE_COLUMNS, reprice, usage_csv
from backfill_assets.orchestration.wiring import (
    PLAN_JOB,
    USAGE_JOB,
    build_definitions,
)
from backfill_assets.store.budget import budget_status
from backfill_assets.store.dead_letters import requeue
from backfill_assets.store.engine import read_tx, write_tx
from backfill_assets.store.migrate import migrate, schema_versions
from backfill_assets.store.posts import slice_levels
from backfill_assets.store.reports import tenant_ids
from backfill_assets.store.tenants import all_regions
from backfill_assets.store.usage import ledger_by_model_day, usage_by_day, usage_by_tenant_model
from backfill_assets.store.verification import verify_store


def emit(args: argparse.Namespace, doc: Any, *human: Human) -> None:
    """Print ``doc`` as JSON with ``--json``, else the human parts (tables and lines)."""
    if args.json:
        print(json.dumps(doc, sort_keys=True, default=str), flush=True)
    else:
        show(*human)


def store_tenants(engine: sa.Engine, values: list[str]) -> list[str]:
    """The ``--tenant`` values, each known to the store; all tenants when none is given."""
    with read_tx(engine) as conn:
        known = tenant_ids(conn)
    return known_tenants(values, known) or known


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    """Materialise labels, checks and the gated apply in-process; exit 1 if a check blocked."""
    engine = settings.store_engine()
    tenants = store_tenants(engine, args.tenant)
    if args.deadline:
        if args.sample or args.slice or args.force:
            raise UserError(
                "--deadline plans every slice of the tenants: not with --sample, --slice or --force"
            )
        if not args.dry_run:
            require_gate(settings)
        built: list[tuple[Any, Any]] = []

        def show_progress() -> bool:
            # The UI's backfill_plan shows the plan's progress after each step.
            if not built:
                built.append((build_definitions(settings), instance(settings)))
            return refresh(*built[0], PLAN_JOB)

        code, plan_doc, plan_human = cmd_run_deadline(
            args,
            settings,
            tenants,
            lambda chosen, tenants: dagster_run(args, chosen, engine, tenants, restrict=True),
            show_progress,
        )
        emit(args, plan_doc, *plan_human)
        return code
    if args.dry_run or args.best_effort or args.replan:
        raise UserError(
            "--dry-run, --best-effort and --replan go with --deadline (see `dry-run` for costs)"
        )
    if args.sample:
        # The canary runs before any evaluation may exist: it is how one learns cheaply.
        return _run_sample(args, settings, engine, tenants)
    require_gate(settings)
    doc, human = dagster_run(args, settings, engine, tenants, restrict=bool(args.tenant))
    emit(args, doc, *human)
    return 0 if doc["ok"] else 1


def dagster_run(
    args: argparse.Namespace,
    settings: Settings,
    engine: sa.Engine,
    tenants: list[str],
    restrict: bool,
) -> tuple[dict[str, Any], list[Human]]:
    """The partitions with work of ``tenants`` (every tenant unless ``restrict``) through
    Dagster: labels, checks, the gated apply. Interrupted: prints why and re-raises."""
    defs, inst = build_definitions(settings), instance(settings)
    with read_tx(engine) as conn:
        levels = slice_levels(conn, tenants)
    order = ensure_partitions(inst, levels)
    # Only partitions with something to do reach Dagster, pooled into few runs (pooling.py).
    sink = settings.sink()
    plan = make_plan(
        engine,
        inst,
        settings.versions(),
        tenants if restrict else None,
        [slice_no(s) for s in args.slice] if args.slice else None,
        force=args.force,
        sink_id=None if sink is None else sink.sink_id,
        order=order,
    )
    with read_tx(engine) as conn:
        regions = all_regions(conn)
    # One region per run: a region without an endpoint here fails only its own runs, and
    # each run carries its region's tag for the run queue.
    plan = pool_by_region(plan, order, regions)
    # A big plan spreads over the cores (run_processes.py); a small one runs here.
    shared = run_plan(settings, defs, inst, plan, regions)
    records, plan = shared.records, shared.plan
    if records and not shared.interrupted:
        refresh(defs, inst, USAGE_JOB)  # tenant_usage shows this run's spend at once
    doc = run_document(records, plan, shared.processes)
    if shared.interrupted:
        emit(
            args,
            doc,
            "interrupted: finished work is committed and the run is marked canceled;"
            " `backfill-moderation run` again continues where it stopped",
        )
        raise KeyboardInterrupt
    rows = human_rows(doc)
    # Beyond a screenful of partitions, one row per tenant (--json has every partition).
    human: list[Human] = [table(rows if len(rows) <= 48 else by_tenant(rows), HUMAN_COLUMNS)]
    human.append(totals_line(doc))
    skipped = skipped_line(doc)
    if skipped:
        human.append(skipped)
    human += [
        f"run {r['run_id']} ({r['job']}) failed: {r['error']}"
        for r in doc["runs"]
        if not r["success"]
    ]
    if doc["blocked_partitions"]:
        human.append("blocking checks failed; see `backfill-moderation check --tenant T --slice S`")
    return doc, human


def _run_sample(
    args: argparse.Namespace, settings: Settings, engine: sa.Engine, tenants: list[str]
) -> int:
    """``run --sample N``: each tenant's canary, its label shares beside the live column's."""
    model = settings.model_resource()
    rubric = settings.rubric()
    options = settings.run_settings().run_options(model, settings.faults())
    drift = settings.checks().bounds(rubric.policy).drift
    try:
        found = run_sample(engine, tenants, args.sample, rubric, model, options, drift)
    except RunStopped as exc:
        emit(args, {"ok": False, "error": str(exc)}, f"sample stopped: {exc}")
        return 1
    doc = {
        "ok": True,
        "policy": rubric.policy.identity,
        "sample": args.sample,
        "tenants": [t.as_dict() for t in found],
    }
    rows = []
    for t in doc["tenants"]:
        for label in sorted(set(t["labels"]) | set(t["live_labels"])):
            rows.append(
                {
                    "tenant": t["tenant"],
                    "label": label + (" (drift)" if label in t["drifted"] else ""),
                    "sample": t["labels"].get(label, 0),
                    "sample_share": f"{t['shares'].get(label, 0.0):.1%}",
                    "live_share": (
                        f"{t['live_shares'][label]:.1%}" if label in t["live_shares"] else "-"
                    ),
                }
            )
    calls = sum(t["calls"] for t in doc["tenants"])
    sampled = sum(t["sampled"] for t in doc["tenants"])
    emit(
        args,
        doc,
        table(rows, ["tenant", "label", "sample", "sample_share", "live_share"]),
        f"policy {rubric.policy.identity}: {sampled} post(s) sampled, {calls} call(s) this run; "
        "the full run re-pays none of them",
    )
    return 0


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    """Audit the store; exit 1 on isolation/duplicate problems (or missing keys if required)."""
    engine = settings.store_engine()
    with read_tx(engine) as conn:
        tenants = known_tenants(args.tenant, tenant_ids(conn))
    outcome = verify_store(engine, settings.versions(), tenants or None, settings.sink())
    doc = outcome.as_dict(require_complete=args.require_complete)
    human = table(
        doc["tenants"],
        [
            "tenant",
            "expected",
            "done",
            "dead",
            "missing",
            "billed_tokens",
            "rebilled_tokens",
            "orphan_attempts",
            "usage_missing",
            "over_bound",
        ],
    )
    problems = [
        f"{p['kind']}: tenant={p['tenant']} table={p['table']} key={p['key'][:16]} {p['detail']}"
        for p in doc["problems"][:50]
    ]
    sink = doc.get("sink")
    if sink:
        pending = sink["pending_partitions"]
        problems.append(f"{sink['name']}: {pending} partition(s) applied but not written back")
    emit(args, doc, human, *problems, "OK" if doc["ok"] else "FAILED")
    return 0 if doc["ok"] else 1


def cmd_usage(args: argparse.Namespace, settings: Settings) -> int:
    """Tokens, cost and calls per tenant, model and day (or per tenant and model)."""
    engine = settings.store_engine()
    if args.reconcile:
        return _reconcile(args, engine)
    if args.reprice:
        with read_tx(engine) as conn:
            repriced = reprice(conn, settings.prices())
        emit(args, {"usage": repriced}, table(repriced, REPRICE_COLUMNS))
        return 0
    with read_tx(engine) as conn:
        rows = usage_by_tenant_model(conn) if args.totals else usage_by_day(conn)
    cols = [c for c in USAGE_COLUMNS if not (args.totals and c == "day")]
    if args.csv:
        print(usage_csv(rows, cols), end="", flush=True)
        return 0
    emit(args, {"usage": rows}, table(rows, cols))
    return 0


# A year of daily buckets for hundreds of models is well under a megabyte.
_MAX_REPORT_BYTES = 64 << 20


def _reconcile(args: argparse.Namespace, engine: sa.Engine) -> int:
    """``usage --reconcile FILE``: the ledger against the provider's own report."""
    path = Path(args.reconcile)
    try:
        if path.stat().st_size > _MAX_REPORT_BYTES:
            raise UserError(
                f"--reconcile: {path} is over {_MAX_REPORT_BYTES >> 20} MiB: not a usage report"
            )
        report = read_report(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--reconcile: cannot read {path}: {type(exc).__name__}") from None
    except ReportError as exc:
        raise UserError(f"--reconcile: {path}: {exc}") from None
    with read_tx(engine) as conn:
        ledger = ledger_by_model_day(conn)
    diffs = compare(ledger, report)
    doc = {
        "ok": not diffs,
        "days": len({d for d, *_ in ledger} | {d for d, _m in report.usage}),
        "cost_compared": report.cost_by_day is not None,
        "differences": [asdict(d) for d in diffs],
    }
    summary = f"reconciled {doc['days']} day(s) of usage" + (
        "" if report.cost_by_day is not None else " (no costs pages: cost not compared)"
    )
    emit(args, doc, *[d.line() for d in diffs], summary, "OK" if not diffs else "DIFFERENT")
    return 0 if not diffs else 1


def cmd_dry_run(args: argparse.Namespace, settings: Settings) -> int:
    """Pending keys per tenant, with estimated tokens and cost and the reserved upper bound."""
    engine = settings.store_engine()
    rubric = settings.rubric()
    if args.policy:
        # What another policy would cost, before switching BACKFILL_POLICY_PATH to it.
        rubric = Rubric(load_user_policy(args.policy))
    versions = versions_for(settings.model_resource(), rubric)
    tenants = store_tenants(engine, args.tenant)
    default_tokens = settings.tenant_budget_tokens or None
    with read_tx(engine) as conn:
        rows = [
            e.as_dict()
            for e in estimate_pending(conn, tenants, versions, rubric, settings.prices())
        ]
        for row in rows:
            row.update(budget_status(conn, row["tenant"], default_tokens).as_dict())
    doc = {"versions": versions.code_version, "policy": rubric.policy.identity, "tenants": rows}
    columns = [
        "tenant",
        "keys",
        "estimated_tokens",
        "bound_tokens",
        "estimated_cost_usd",
        "estimated_cost_usd_batch",
        "bound_cost_usd",
        "budget_usd",
        "free_usd",
    ]
    note = (
        "estimated: bytes/3 per prompt + max_tokens (sync, and batch at its price); bound: what "
        "a strict budget reserves (every byte a token + template + schema + max_tokens, at the "
        "dearest input price); free: budget minus billed minus reserved by runs in flight"
    )
    emit(
        args,
        doc,
        table(rows, columns),
        note,
        f"policy {rubric.policy.identity}",
        versions.code_version,
    )
    return 0


def cmd_requeue(args: argparse.Namespace, settings: Settings) -> int:
    """Delete dead letters so those keys are sent again on the next run."""
    engine = settings.store_engine()
    tenant = store_tenants(engine, [args.tenant])[0]
    with write_tx(engine) as conn:
        n = requeue(conn, tenant, args.outcome)
    doc = {"tenant": tenant, "outcome": args.outcome, "requeued": n}
    emit(args, doc, f"requeued {doc['requeued']} {args.outcome} key(s) of {tenant}")
    return 0


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    """Apply migrations."""
    engine = settings.store_engine()
    with read_tx(engine) as conn:
        versions = schema_versions(conn)
    applied = migrate(engine)
    emit(
        args,
        {"applied": applied, "current": sorted(versions)},
        f"schema at {max(versions, default=0)}",
    )
    return 0


def cmd_demo_data(args: argparse.Namespace, settings: Settings) -> int:
    """Write a synthetic export."""
    tenants = ["acme", "globex", "initech", "umbrella", "hooli", "wayne", "stark", "tyrell"]
    while len(tenants) < args.tenants:
        tenants.append(f"tenant-{len(tenants):04d}")
    n = write_export(
        Path(args.out), tenants[: args.tenants], args.posts, bad_lines=not args.no_bad_lines
    )
    emit(args, {"path": args.out, "lines": n}, f"wrote {n} lines to {args.out}")
    return 0
