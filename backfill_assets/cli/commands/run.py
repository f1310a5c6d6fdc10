"""``backfill-moderation run``: the partitions with work through Dagster (labels, checks, the
gated apply), a canary sample (``--sample``), or a deadline plan (``--deadline``).

Imported only when ``run`` is chosen (``cli/parsers.py``, ``lazy``), so it may load the
runner, and with it Dagster and the provider stack, at its top."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from backfill_assets.cli.commands.deadline import cmd_run_deadline
from backfill_assets.cli.commands.run_report import (
    HUMAN_COLUMNS,
    by_tenant,
    human_rows,
    run_document,
    skipped_line,
    totals_line,
)
from backfill_assets.cli.inputs import require_gate, store_tenants
from backfill_assets.cli.process import freeze_heap
from backfill_assets.cli.tables import Human, emit, table
from backfill_assets.domain.errors import UserError
from backfill_assets.domain.work import slice_no
from backfill_assets.runner.api import (
    RunResource,
    RunStopped,
    model_resource,
    plan_progress,
    run_sample,
    run_work,
)

if TYPE_CHECKING:
    import sqlalchemy as sa

    from backfill_assets.config.settings import Settings


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    """Materialise labels, checks and the gated apply in-process; exit 1 if a check blocked."""
    from backfill_assets.runner.queries import store_engine

    # This module, and with it Dagster and the provider stack, loads only when `run` is chosen
    # (cli/parsers.py, lazy); what they bring lives until the process ends, so the collector
    # is spared it (process.py).
    freeze_heap()
    _check_flags(args)
    if settings.stages() is not None and (args.deadline or args.sample):
        # A plan or a sample prices one model; a cascade's cost depends on what its first
        # stages decide, known only once they have answered (docs/cascade.md).
        raise UserError(
            "--deadline and --sample plan one model's calls: not with BACKFILL_CASCADE_PATH"
        )
    settings.require_price()
    engine = store_engine(settings.store)
    tenants = store_tenants(engine, args.tenant)
    if args.deadline:
        if not args.dry_run:
            require_gate(settings)
        code, plan_doc, plan_human = cmd_run_deadline(
            args,
            settings,
            tenants,
            lambda chosen, tenants: dagster_run(args, chosen, engine, tenants, restrict=True),
            # The UI's backfill_plan shows the plan's progress after each step.
            plan_progress(settings),
        )
        emit(args, plan_doc, *plan_human)
        return code
    if args.sample:
        # The canary runs before any evaluation may exist: it is how one learns cheaply.
        return _run_sample(args, settings, engine, tenants)
    require_gate(settings)
    doc, human = dagster_run(args, settings, engine, tenants, restrict=bool(args.tenant))
    emit(args, doc, *human)
    return 0 if doc["ok"] else 1


def _check_flags(args: argparse.Namespace) -> None:
    """Flags that do not go together: refused before the store is opened."""
    if args.deadline and (args.sample or args.slice or args.force):
        raise UserError(
            "--deadline plans every slice of the tenants: not with --sample, --slice or --force"
        )
    if not args.deadline and (args.dry_run or args.best_effort or args.replan):
        raise UserError(
            "--dry-run, --best-effort and --replan go with --deadline (see `dry-run` for costs)"
        )


def dagster_run(
    args: argparse.Namespace,
    settings: Settings,
    engine: sa.Engine,
    tenants: list[str],
    restrict: bool,
) -> tuple[dict[str, Any], list[Human]]:
    """The partitions with work of ``tenants`` (every tenant unless ``restrict``) through
    Dagster: labels, checks, the gated apply. Interrupted: prints why and re-raises."""
    slices = [slice_no(s) for s in args.slice] if args.slice else None
    shared = run_work(settings, engine, tenants, slices, force=args.force, restrict=restrict)
    records, plan = shared.records, shared.plan
    doc = run_document(records, plan, shared.processes)
    if shared.interrupted:
        emit(
            args,
            doc,
            "interrupted: finished work is committed and the run is marked canceled;"
            " `backfill-moderation run` again continues where it stopped",
        )
        raise KeyboardInterrupt
    if args.json:
        return doc, []  # the tables are for people: 10,000 tenants' rows cost 0.4 s
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
    model = model_resource(settings)
    rubric = settings.rubric()
    options = RunResource.of(settings).run_options(model, settings.drills.faults())
    drift = settings.checks.bounds(rubric.policy).drift
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
