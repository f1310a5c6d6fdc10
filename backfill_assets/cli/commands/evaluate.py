"""``evaluate GOLD [--policy FILE] [--against FILE] [--tenant T] [--report DIR]``: a policy
measured on a gold set before the sweep, through the backfill's own keys, ledger and
dispatcher, with its calibration (and with ``--report``, pictures of it). With ``--cascade
FILE [--target-macro-f1 X] [--write FILE]``, a cascade's thresholds swept (``cascade.py``)."""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backfill_assets.cli.commands.cascade import plan_sweep, run_sweep
from backfill_assets.cli.commands.people.baseline import add_against_baseline, baseline_or
from backfill_assets.cli.inputs import load_user_policy
from backfill_assets.cli.numbers import share
from backfill_assets.cli.process import freeze_heap
from backfill_assets.cli.tables import Human, emit, table
from backfill_assets.domain.errors import UserError
from backfill_assets.domain.policy import DEFAULT_TENANT, NO_LABEL, Rubric
from backfill_assets.domain.work import InvalidTenantId, validate_tenant_id

if TYPE_CHECKING:
    from backfill_assets.config.settings import Settings

LABEL_COLUMNS = ["label", "support", "precision", "precision_ci95", "recall", "recall_ci95", "f1"]
BIN_COLUMNS = ["bin", "rows", "mean score", "accuracy"]
ECE_COLUMNS = ["label", "scored rows", "ECE"]


def add_evaluate_command(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Register ``evaluate``."""
    sp = add(
        "evaluate",
        "Label a gold set (CSV, JSONL or Parquet: id, text, label, optional rule) under a policy "
        "and report precision, recall, F1, the confusion matrix and the cost; a rerun pays "
        "nothing.",
    )
    sp.add_argument(
        "gold",
        metavar="GOLD",
        nargs="?",
        help="the gold set (JSONL, CSV or Parquet, also gzip: by content)",
    )
    sp.add_argument(
        "--policy", metavar="FILE", help="the policy to evaluate (default: BACKFILL_POLICY_PATH's)"
    )
    sp.add_argument(
        "--against",
        metavar="FILE",
        help="a second policy (the baseline): both figures, agreement, kappa, transitions",
    )
    sp.add_argument(
        "--tenant",
        default=None,
        help=f"the tenant the calls are booked to (default {DEFAULT_TENANT}; never a customer's); "
        "with --against-baseline, the one tenant compared (default: every tenant)",
    )
    sp.add_argument(
        "--report",
        metavar="DIR",
        help="also write confusion_matrix.png, reliability.png, precision_recall.png and "
        "calibration.json into DIR (made if missing; with --against, the baseline's in "
        "DIR/against)",
    )
    sp.add_argument(
        "--cascade",
        metavar="FILE",
        help="sweep this cascade file's thresholds: every gold post through every stage once, "
        "then each setting's decided shares, cost per 1,000 posts and macro-F1 with its 95%% "
        "interval, and the frontier (docs/cascade.md)",
    )
    sp.add_argument(
        "--target-macro-f1",
        metavar="X",
        type=share("a macro-F1"),
        help="with --cascade: choose the cheapest setting whose macro-F1 interval's lower bound "
        "reaches X (0 to 1); exit 1 when none does",
    )
    sp.add_argument(
        "--write",
        metavar="FILE",
        help="with --target-macro-f1: write the chosen setting as a cascade file here "
        "(default: print it)",
    )
    sp.add_argument(
        "--from-decisions",
        action="store_true",
        help="no GOLD: moderators' decisions are the gold set, each decided post's text with its "
        "newest decision's label and first rule (--tenant: that tenant's; the calls are booked "
        f"to {DEFAULT_TENANT})",
    )
    sp.add_argument(
        "--since",
        metavar="D",
        type=_since,
        help="with --from-decisions: decisions made at or after D (ISO 8601; UTC unless given)",
    )
    add_against_baseline(sp)
    sp.set_defaults(func=baseline_or(cmd_evaluate))


def _since(text: str) -> dt.datetime:
    """``--since``: an ISO 8601 date or time, as naive UTC (the store's)."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an ISO 8601 date or time") from None
    return when.astimezone(dt.UTC).replace(tzinfo=None) if when.tzinfo else when


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _ci(value: list[float] | None) -> str:
    return "-" if not value else f"{value[0]:.1%}-{value[1]:.1%}"


def _ece(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _calibration(cal: dict[str, Any]) -> list[Human]:
    """Overall ECE and reliability table, each label's ECE (the PR table is in --json and
    --report's calibration.json: 101 rows a label)."""
    overall = cal["overall"]
    head = (
        f"calibration (score: {cal['score']}): ECE {_ece(overall['ece'])} over "
        f"{overall['rows']} scored rows of {cal['rows']}"
    )
    bins = [
        {
            "bin": f"{b['lower']:.1f}-{b['upper']:.1f}",
            "rows": b["count"],
            "mean score": f"{b['mean_score']:.3f}",
            "accuracy": _pct(b["accuracy"]),
        }
        for b in overall["reliability"]
        if b["count"]
    ]
    eces = [
        {"label": c["label"], "scored rows": c["rows"], "ECE": _ece(c["ece"])}
        for c in cal["labels"]
    ]
    return [
        head,
        table(bins, BIN_COLUMNS, title="reliability (bins with rows)"),
        table(eces, ECE_COLUMNS, title="ECE per label"),
    ]


def _human(report: dict[str, Any]) -> list[Human]:
    head = (
        f"{report['policy']} ({report['model']}): {report['rows']} rows, accuracy "
        f"{report['accuracy']:.1%}, macro-F1 {report['macro_f1']:.3f}, schema_rejected "
        f"{report['schema_rejected_share']:.1%}; tokens {report['tokens_in']} in / "
        f"{report['tokens_out']} out, cost ${Decimal(report['cost_usd']):.6f} "
        f"(${Decimal(report['cost_per_1000_posts_usd']):.6f} per 1,000 posts); "
        f"{report['calls_this_run']} call(s) this run"
    )
    rows = [
        {
            **f,
            "precision": _pct(f["precision"]),
            "recall": _pct(f["recall"]),
            "precision_ci95": _ci(f["precision_ci95"]),
            "recall_ci95": _ci(f["recall_ci95"]),
            "f1": f"{f['f1']:.3f}",
        }
        for f in report["labels"]
    ]
    confusion = report["confusion"]
    cols = list(next(iter(confusion.values())).keys())
    matrix = [{"expected": e, **row} for e, row in confusion.items()]
    return [
        head,
        table(rows, LABEL_COLUMNS, title="per label (95% Wilson intervals)"),
        table(matrix, ["expected", *cols], title="confusion (expected x answered)"),
        *_calibration(report["calibration"]),
    ]


def _transitions(doc: dict[str, Any]) -> Human:
    moves = doc["transitions"]
    cols = sorted({b for row in moves.values() for b in row}, key=lambda x: (x == NO_LABEL, x))
    rows = [{"from \\ to": a, **{c: row.get(c, 0) for c in cols}} for a, row in moves.items()]
    return table(rows, ["from \\ to", *cols], title=f"transitions {doc['from']} -> {doc['to']}")


def cmd_evaluate(args: argparse.Namespace, settings: Settings) -> int:
    """Evaluate one policy (or two, with ``--against``) on a gold set; exit 0, 1 if a
    run-level error stopped it, 2 for bad input."""
    from backfill_assets.runner.api import (
        GoldError,
        ReportDirError,
        RunResource,
        RunStopped,
        check_report_dir,
        comparison,
        evaluate_policies,
        model_resource,
        store_gold,
    )
    from backfill_assets.runner.queries import CustomerTenant, engine_for

    freeze_heap()  # what the runner loaded lives until the end (process.py)

    try:
        tenant = validate_tenant_id(DEFAULT_TENANT if args.tenant is None else args.tenant)
    except InvalidTenantId as exc:
        raise UserError(f"argument --tenant: {exc}") from None
    decided_by, tenant = _decided_by(args, tenant)
    plan = plan_sweep(args, settings)  # --cascade: its file checked before the store opens
    if plan is None:
        settings.require_price()
    if settings.stages() is not None and (args.policy or args.against):
        # A cascade is evaluated as it is configured: its stages under the policy in force.
        raise UserError("--policy and --against evaluate one model: not with BACKFILL_CASCADE_PATH")
    policy = Rubric(load_user_policy(args.policy)) if args.policy else settings.rubric()
    rubrics = [policy]
    if args.against:
        rubrics.insert(0, Rubric(load_user_policy(args.against)))
    try:
        report_dir = check_report_dir(args.report) if args.report else None
    except ReportDirError as exc:
        raise UserError(f"argument --report: {exc}") from None
    # A gold file is read before the store opens (a wrong path creates nothing); the
    # decisions are in the store.
    engine = engine_for(settings.store.url) if args.from_decisions else None
    try:
        gold, source = _gold(args, engine, policy, tenant, decided_by)
    except GoldError as exc:
        raise UserError(
            f"argument {'--from-decisions' if args.from_decisions else 'GOLD'}: {exc}"
        ) from None
    engine = engine or engine_for(settings.store.url)
    try:
        store_gold(engine, gold, tenant, source[0], settings.run.slice_target_posts)
    except CustomerTenant as exc:
        raise UserError(f"argument --tenant: {exc}") from None
    model = model_resource(settings)
    if plan is not None:
        return _sweep(args, settings, plan, engine, gold, tenant, report_dir, source)
    options = RunResource.of(settings).run_options(model, settings.drills.faults())
    try:
        results = evaluate_policies(engine, gold, rubrics, model, options, tenant, source)
    except RunStopped as exc:
        emit(args, {"ok": False, "error": str(exc)}, f"evaluation stopped: {exc}")
        return 1
    doc: dict[str, Any] = {
        "ok": True,
        "tenant": tenant,
        "gold": {
            "file": args.gold,
            "source": source[0],
            "rows": len(gold.rows),
            "rejected": gold.rejected_rows,
        },
        "rejected": [
            {"line": r.line, "reason": r.reason, **({"rows": r.rows} if r.rows > 1 else {})}
            for r in gold.rejected
        ],
        "policies": [r.report for r in results],
    }
    human = _rejected(gold)
    for result in results:
        human += _human(result.report)
    if report_dir is not None:
        doc["report"] = _write_reports(engine, report_dir, results)
        human.append(f"report: {', '.join(doc['report']['files'])}")
    if args.against:
        doc["comparison"] = comparison(results[0], results[1])
        cmp = doc["comparison"]
        kappa = "-" if cmp["kappa"] is None else f"{cmp['kappa']:.3f}"
        human += [f"agreement {cmp['agreement']:.1%}, Cohen's kappa {kappa}", _transitions(cmp)]
    # The UI shows it beside the backfill: policy_evaluation's metadata and its gate check.
    check_result = _record_in_dagster(settings, engine, settings.rubric(), model.model)
    doc["gate"] = {"passed": check_result.passed, "summary": check_result.summary}
    if settings.policy_gate() is not None:
        human.append(
            f"gate: {'passed' if check_result.passed else 'FAILED'}: {check_result.summary}"
        )
    emit(args, doc, *human)
    return 0


def _sweep(
    args: argparse.Namespace,
    settings: Settings,
    plan: Any,
    engine: Any,
    gold: Any,
    tenant: str,
    report_dir: Path | None,
    source: tuple[str, str],
) -> int:
    """``--cascade``: the sweep (``cascade.py``), then ``policy_evaluation`` as evaluate
    records it."""
    from backfill_assets.runner.api import RunStopped, model_resource

    try:
        doc, human, code = run_sweep(args, plan, engine, gold, tenant, source, report_dir)
    except RunStopped as exc:
        emit(args, {"ok": False, "error": str(exc)}, f"evaluation stopped: {exc}")
        return 1
    _record_in_dagster(settings, engine, settings.rubric(), model_resource(settings).model)
    emit(args, doc, *_rejected(gold), *human)
    return int(code)


def _decided_by(args: argparse.Namespace, tenant: str) -> tuple[str | None, str]:
    """(whose decisions, the tenant booked): with ``--from-decisions``, ``--tenant`` names
    whose decisions (None: every tenant's) and the calls stay the evaluation tenant's."""
    if (args.gold is None) != bool(args.from_decisions) or (args.since and not args.from_decisions):
        raise UserError("give GOLD or --from-decisions [--since D], not both")
    return (args.tenant, DEFAULT_TENANT) if args.from_decisions else (None, tenant)


def _gold(
    args: argparse.Namespace, engine: Any, policy: Rubric, tenant: str, decided_by: str | None
) -> tuple[Any, tuple[str, str]]:
    """The gold set of ``tenant`` and its source (name, sha256): GOLD's file, or with
    ``--from-decisions`` the decided posts under the policy's id (``decided_by``'s, or every
    tenant's), named by the filters and digested by their rows: the same decisions, the same
    gold set."""
    from backfill_assets.runner.api import gold_sha256, read_decided_gold, read_gold

    if not args.from_decisions:
        return read_gold(args.gold, tenant), (
            str(Path(args.gold).resolve()),
            gold_sha256(args.gold),
        )
    policy_id = policy.policy.policy_id
    gold, sha = read_decided_gold(engine, policy_id, tenant, decided_by, args.since)
    since = f";since={args.since.isoformat()}" if args.since else ""
    return gold, (f"decisions:policy={policy_id};tenant={decided_by or '*'}{since}", sha)


def _rejected(gold: Any) -> list[Human]:
    """The gold set's rejected rows, each with its line."""
    return [
        f"{'line' if r.rows == 1 else f'{r.rows} lines from'} {r.line}: {r.reason}"
        for r in gold.rejected
    ]


def _write_reports(engine: Any, folder: Path, results: list[Any]) -> dict[str, Any]:
    """Each policy's report: the one evaluated in ``folder``, the baseline (``--against``,
    evaluated first) in its subfolder."""
    from backfill_assets.runner.api import AGAINST, ReportDirError, write_report

    folders = [folder / AGAINST, folder] if len(results) == 2 else [folder]
    written: list[Path] = []
    try:
        for where, result in zip(folders, results, strict=True):
            written += write_report(engine, where, result.report, result.evaluation_id)
    except ReportDirError as exc:
        raise UserError(f"argument --report: {exc}") from None
    return {"dir": str(folder), "files": [str(p) for p in written]}


def _record_in_dagster(settings: Settings, engine: Any, rubric: Rubric, model: str) -> Any:
    """``policy_evaluation`` and its gate check for the policy (and model) in force, as the UI
    shows them; returns the gate's result."""
    import dagster as dg

    from backfill_assets.runner.api import (
        POLICY_EVALUATION,
        evaluation_metadata,
        gate_evaluation,
        gate_result,
        instance,
    )

    check_result = gate_result(engine, rubric, model, settings.policy_gate())
    inst = instance(settings)
    try:
        inst.report_runless_asset_event(
            dg.AssetMaterialization(
                asset_key=POLICY_EVALUATION, metadata=evaluation_metadata(engine, rubric, model)
            )
        )
        inst.report_runless_asset_event(gate_evaluation(check_result))
    finally:
        inst.dispose()
    return check_result
