"""The store's commands: verify, usage, dry-run, requeue, migrate, demo-data (``run``:
``run.py``). Each takes parsed args and the settings and returns an exit code."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from backfill_assets.cli.inputs import known_tenants, load_user_policy, store_tenants
from backfill_assets.cli.process import freeze_heap
from backfill_assets.cli.tables import emit, show_csv, table
from backfill_assets.domain.errors import UserError
from backfill_assets.domain.money import ProviderReport, ReportError, compare, read_report
from backfill_assets.domain.policy import Rubric
from backfill_assets.domain.ranges import PATH_SHOWN, shown

if TYPE_CHECKING:
    import sqlalchemy as sa

    from backfill_assets.config.settings import Settings


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    """Check the store; exit 1 on isolation/duplicate problems (or missing keys if required)."""
    from backfill_assets.runner.api import sink_of, verify_store
    from backfill_assets.runner.queries import read_tx, store_engine, tenant_ids

    freeze_heap()  # what the runner loaded lives until the end (process.py)

    engine = store_engine(settings.store)
    with read_tx(engine) as conn:
        tenants = known_tenants(args.tenant, tenant_ids(conn))
    outcome = verify_store(engine, settings.versions(), tenants or None, sink_of(settings.data))
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
    from backfill_assets.runner.api import REPRICE_COLUMNS, USAGE_COLUMNS, reprice, usage_csv
    from backfill_assets.runner.queries import (
        read_tx,
        store_engine,
        usage_by_day,
        usage_by_tenant_model,
    )

    if args.reconcile:
        # The report is read, and refused if need be, before the store is opened.
        report = _read_report(Path(args.reconcile))
        return _reconcile(args, store_engine(settings.store), report)
    engine = store_engine(settings.store)
    if args.reprice:
        with read_tx(engine) as conn:
            repriced = reprice(conn, settings.model.prices())
        emit(args, {"usage": repriced}, table(repriced, REPRICE_COLUMNS))
        return 0
    with read_tx(engine) as conn:
        rows = usage_by_tenant_model(conn) if args.totals else usage_by_day(conn)
    cols = [c for c in USAGE_COLUMNS if not (args.totals and c == "day")]
    stages = settings.stages()
    if stages is not None:
        # Under a cascade, each row says which of its stages the model's calls were: the cost
        # per stage (two stages of one model share their rows).
        named: dict[str, list[str]] = {}
        for st in stages.stages:
            named.setdefault(st.model.name, []).append(st.name)
        rows = [{**r, "stage": "+".join(named.get(str(r["model"]), ["-"]))} for r in rows]
        cols.insert(cols.index("model") + 1, "stage")
    if args.csv:
        show_csv(usage_csv(rows, cols))
        return 0
    emit(args, {"usage": rows}, table(rows, cols))
    return 0


# A year of daily buckets for hundreds of models is well under a megabyte.
_MAX_REPORT_BYTES = 64 << 20


def _read_report(path: Path) -> ProviderReport:
    """The ``--reconcile`` file, read and checked (UserError naming what is wrong)."""
    try:
        if path.stat().st_size > _MAX_REPORT_BYTES:
            raise UserError(
                f"--reconcile: {path} is over {_MAX_REPORT_BYTES >> 20} MiB: not a usage report"
            )
        return read_report(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--reconcile: cannot read {path}: {type(exc).__name__}") from None
    except ReportError as exc:
        raise UserError(f"--reconcile: {path}: {exc}") from None


def _reconcile(args: argparse.Namespace, engine: sa.Engine, report: ProviderReport) -> int:
    """``usage --reconcile FILE``: the ledger against the provider's own report."""
    from backfill_assets.runner.queries import ledger_by_model_day, read_tx

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
    from backfill_assets.runner.api import model_resource, stage_models, versions_for
    from backfill_assets.runner.queries import (
        budget_status,
        estimate_pending,
        read_tx,
        store_engine,
    )

    settings.require_price()
    rubric = settings.rubric()
    if args.policy and settings.stages() is not None:
        raise UserError("dry-run --policy prices one model's calls: not with BACKFILL_CASCADE_PATH")
    if args.policy:
        # What another policy would cost, before switching BACKFILL_POLICY_PATH to it.
        rubric = Rubric(load_user_policy(args.policy))
    engine = store_engine(settings.store)
    model = model_resource(settings)
    versions = versions_for(model, rubric)
    tenants = store_tenants(engine, args.tenant)
    default_tokens = settings.run.tenant_budget_tokens or None
    with read_tx(engine) as conn:
        rows = [
            e.as_dict()
            for e in estimate_pending(
                conn, tenants, versions, rubric, settings.model.prices(), stage_models(model)
            )
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
    if settings.stages() is not None:
        note += "; a cascade: every pending post counted through every stage (the worst case)"
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
    from backfill_assets.runner.queries import requeue, store_engine, write_tx

    engine = store_engine(settings.store)
    tenant = store_tenants(engine, [args.tenant])[0]
    with write_tx(engine) as conn:
        n = requeue(conn, tenant, args.outcome)
    doc = {"tenant": tenant, "outcome": args.outcome, "requeued": n}
    emit(args, doc, f"requeued {doc['requeued']} {args.outcome} key(s) of {tenant}")
    return 0


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    """Run the pending migrations (the JSON field keeps its name, ``applied``)."""
    from backfill_assets.runner.queries import migrate, read_tx, schema_versions, store_engine

    engine = store_engine(settings.store)
    with read_tx(engine) as conn:
        versions = schema_versions(conn)
    ran = migrate(engine)
    emit(
        args,
        {"applied": ran, "current": sorted(versions)},
        f"schema at {max(versions, default=0)}",
    )
    return 0


def cmd_demo_data(args: argparse.Namespace, settings: Settings) -> int:
    """Write a synthetic export."""
    from backfill_assets.runner.api import write_export

    tenants = ["acme", "globex", "initech", "umbrella", "hooli", "wayne", "stark", "tyrell"]
    while len(tenants) < args.tenants:
        tenants.append(f"tenant-{len(tenants):04d}")
    try:
        n = write_export(
            Path(args.out), tenants[: args.tenants], args.posts, bad_lines=not args.no_bad_lines
        )
    except (OSError, UnicodeError) as exc:  # a directory, no permission, a name not UTF-8
        where, why = shown(args.out, PATH_SHOWN), type(exc).__name__
        raise UserError(f"argument --out: cannot write {where} ({why})") from None
    emit(args, {"path": args.out, "lines": n}, f"wrote {n} lines to {args.out}")
    return 0
