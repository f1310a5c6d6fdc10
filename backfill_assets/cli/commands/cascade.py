"""``cascade check FILE``: a cascade file checked against the policy in force, before it costs
anything; and ``evaluate GOLD --cascade FILE [--target-macro-f1 X] [--write FILE]``, the
threshold sweep: its file checked, then its tables (docs/cascade.md).

``evaluate --cascade --json`` prints ``{"ok", "tenant", "gold": {"file", "sha256", "rows",
"rejected"}, "cascade", "stages": [{"name", "dialect", "model", "decide", "calls_this_run",
"cost_usd"}], "target_macro_f1", "settings": [setting], "frontier": [setting], "own": setting,
"chosen": setting | null, "best_lower_bound": setting, "cascade_file", "cascade_yaml",
"evaluation", "bootstrap", "calls_this_run", "seconds", "gate"}`` (and ``report``, ``error``);
a setting is ``sweep.py``'s ``SettingFigures.as_dict``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backfill_assets.cli.parsers import command_group
from backfill_assets.cli.tables import Human, emit, table, tell
from backfill_assets.domain.cascade import (
    Cascade,
    CascadeInvalid,
    CascadeStage,
    FileProblem,
    cascade_problems,
    cascade_yaml,
    load_cascade,
)
from backfill_assets.domain.errors import UserError

if TYPE_CHECKING:
    from backfill_assets.config.settings import Settings

# Exit status of a cascade file with problems (bad input, as everywhere in the CLI).
INVALID = 2


def add_cascade_commands(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Register the ``cascade`` group: ``check``."""
    child = command_group(
        add, "cascade", "Cascade files: stages of models, the cheap ones first.", "cascade_command"
    )
    sp = child(
        "check",
        "Check a cascade file: its stages, their decide rules, and that the policy in force "
        "(BACKFILL_POLICY_PATH, else the built-in one) can be read in each stage's dialect; "
        "exit 2 listing every problem with its line and column.",
    )
    sp.add_argument("file", help="the cascade file (YAML)")
    sp.set_defaults(func=cmd_cascade_check)


def _problems(args: argparse.Namespace, path: str, problems: Sequence[FileProblem]) -> int:
    """Print every problem (stdout: they are the answer); exit 2."""
    rows = [
        {"file": path, "line": p.line, "column": p.column, "message": p.message} for p in problems
    ]
    lines = [p.render(path) for p in problems]
    emit(args, {"ok": False, "file": path, "problems": rows}, *lines)
    tell(f"backfill-moderation cascade {args.cascade_command}: {len(lines)} problem(s) in {path}")
    return INVALID


def describe(stage: CascadeStage) -> dict[str, Any]:
    """A stage as ``check --json`` prints it, with the variables its endpoint and key come
    from."""
    rule = stage.decide
    return {
        "name": stage.name,
        "dialect": stage.dialect,
        "model": stage.model,
        "decide": None if rule is None else {"when": rule.when, "min_score": rule.min_score},
        "base_url_var": stage.base_url_var,
        "api_key_var": stage.api_key_var,
    }


def _decide_text(rule: dict[str, Any] | None) -> str:
    return "everything left" if rule is None else f"{rule['when']} >= {rule['min_score']!r}"


def cmd_cascade_check(args: argparse.Namespace, settings: Settings) -> int:
    """Exit 0 with the stages and the variables each reads, or 2 with every problem."""
    path = args.file
    try:
        cascade = load_cascade(path)
    except CascadeInvalid as exc:
        return _problems(args, path, exc.problems)
    policy = settings.rubric().policy
    if problems := cascade_problems(cascade, policy):
        return _problems(args, path, problems)
    stages = [describe(s) for s in cascade.stages]
    doc = {
        "ok": True,
        "file": path,
        "stages": stages,
        "routing_version": cascade.routing_version(),
        "stage_version": cascade.stage_version(),
    }
    rows = [{**s, "stage": s["name"], "decide": _decide_text(s["decide"])} for s in stages]
    emit(
        args,
        doc,
        table(rows, ["stage", "dialect", "model", "decide"], title="stages"),
        table(rows, ["stage", "base_url_var", "api_key_var"], title="environment"),
        f"policy   {policy.identity}",
        f"routing  {doc['routing_version']}  (the decide rules)",
        f"stages   {doc['stage_version']}  (each stage's name, dialect and model)",
        "OK",
    )
    return 0


# ------------------------------------------------------------------ evaluate GOLD --cascade FILE


@dataclass(frozen=True)
class SweepPlan:
    """``evaluate --cascade``'s arguments, checked: the file, the settings with its cascade in
    force, the target and where the chosen setting goes."""

    path: str
    cascade: Cascade
    settings: Settings
    target: float | None
    write: Path | None


def plan_sweep(args: argparse.Namespace, settings: Settings) -> SweepPlan | None:
    """``--cascade`` and its flags checked before the store opens (None: no ``--cascade``);
    every problem of the file with its line, as ``cascade check`` lists them, is exit 2."""
    if args.cascade is None:
        if args.target_macro_f1 is not None or args.write:
            raise UserError("--target-macro-f1 and --write sweep a cascade: add --cascade FILE")
        return None
    if args.policy or args.against:
        raise UserError(
            "--cascade measures the file's stages under the policy in force: "
            "not with --policy or --against"
        )
    if args.write and args.target_macro_f1 is None:
        raise UserError("argument --write: it writes the setting --target-macro-f1 chooses")
    path = args.cascade
    try:
        cascade = load_cascade(path)
        problems = cascade_problems(cascade, settings.rubric().policy)
        if problems:
            raise CascadeInvalid(path, problems)
    except CascadeInvalid as exc:
        raise UserError(f"argument --cascade: {exc}") from None
    swept = settings.for_cascade(cascade, os.environ, "argument --cascade")
    swept.require_price()
    write = _write_target(args.write) if args.write else None
    return SweepPlan(path, cascade, swept, args.target_macro_f1, write)


def _write_target(text: str) -> Path:
    """Where ``--write`` puts the chosen file: a file (new or not) in a folder that exists."""
    path = Path(text).expanduser()
    folder = path.parent
    if path.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        raise UserError(f"argument --write: {text!r} is not a file that can be written")
    return path


def run_sweep(
    args: argparse.Namespace,
    plan: SweepPlan,
    engine: Any,
    gold: Any,
    tenant: str,
    source: tuple[str, str],
    report_dir: Path | None,
) -> tuple[dict[str, Any], list[Human], int]:
    """Sweep, write the chosen file, and say so: the document, the human parts and the exit
    status (1: the target is out of reach)."""
    from backfill_assets.runner.api import (
        ReportDirError,
        RunResource,
        gate_result,
        model_resource,
        sweep_cascade,
        write_frontier,
        write_report,
    )

    settings = plan.settings
    model = model_resource(settings)
    options = RunResource.of(settings).run_options(model, settings.drills.faults())

    def stages_of(cascade: Cascade) -> Any:
        return settings.for_cascade(cascade, os.environ, "argument --cascade").stages()

    got = sweep_cascade(
        engine, gold, model, stages_of, options, tenant, source, plan.target, plan.path
    )
    doc: dict[str, Any] = {"ok": True, "tenant": tenant, **got.doc}
    doc["gold"] = {**doc["gold"], "file": args.gold, "rejected": gold.rejected_rows}
    text = None if got.chosen is None else cascade_yaml(got.chosen, _header(args, plan))
    doc.update(cascade_file=None, cascade_yaml=text)
    kept = got.recorded.report
    doc["evaluation"] = {
        "setting": (doc["chosen"] or doc["own"])["setting"],
        "policy": kept["policy"],
        "key_version": kept["key_version"],
        "mapping_version": kept["mapping_version"],
        "macro_f1": kept["macro_f1"],
        "accuracy": kept["accuracy"],
        "cost_per_1000_posts_usd": kept["cost_per_1000_posts_usd"],
    }
    human = _human(doc)
    code = 0
    if plan.target is not None and got.chosen is None:
        code = 1
        doc["ok"] = False
        doc["error"] = (
            f"no setting reaches a macro-F1 lower bound of {plan.target:g}: the best lower bound "
            f"found is {got.best_lower_bound:.3f} ({doc['best_lower_bound']['setting']})"
        )
        human.append(doc["error"])
    elif text is not None and plan.write is not None:
        # Whole or not at all: a file `run` may read is never seen half written.
        partial = plan.write.with_name(f".{plan.write.name}.{os.getpid()}.tmp")
        partial.write_text(text, "utf-8")
        os.replace(partial, plan.write)
        doc["cascade_file"] = str(plan.write)
        human.append(f"written to {plan.write} (`backfill-moderation cascade check` accepts it)")
    elif text is not None:
        human.append(text.rstrip("\n"))
    check = gate_result(
        engine, got.recorded.rubric, got.recorded.versions.model, plan.settings.policy_gate()
    )
    doc["gate"] = {"passed": check.passed, "summary": check.summary}
    if plan.settings.policy_gate() is not None:
        human.append(
            f"gate for {doc['evaluation']['setting']}: "
            f"{'passed' if check.passed else 'FAILED'}: {check.summary}"
        )
    if report_dir is not None:
        try:
            files = write_report(engine, report_dir, kept, got.recorded.evaluation_id)
            files.append(write_frontier(report_dir, doc))
        except ReportDirError as exc:
            raise UserError(f"argument --report: {exc}") from None
        doc["report"] = {"dir": str(report_dir), "files": [str(p) for p in files]}
        human.append(f"report: {', '.join(doc['report']['files'])}")
    return doc, human, code


def _header(args: argparse.Namespace, plan: SweepPlan) -> list[str]:
    return [
        f"Chosen by `backfill-moderation evaluate {Path(args.gold).name} --cascade "
        f"{Path(plan.path).name} --target-macro-f1 {plan.target:g}`: the cheapest setting",
        "whose macro-F1 interval's lower bound reaches the target on that gold set.",
    ]


def _cost(setting: dict[str, Any]) -> str:
    return f"${Decimal(setting['cost_per_1000_posts_usd']):.6f}"


def _rows(settings: Sequence[dict[str, Any]], names: Sequence[str]) -> list[dict[str, Any]]:
    return [
        {
            "setting": s["setting"],
            **{f"{n} decides": f"{s['decided'][n]:.1%}" for n in names},
            "no label": f"{s['unlabelled']:.1%}",
            "cost / 1k posts": _cost(s),
            "macro-F1 [95% CI]": f"{s['macro_f1']:.3f} [{s['macro_f1_ci95'][0]:.3f}, "
            f"{s['macro_f1_ci95'][1]:.3f}]",
            "accuracy": f"{s['accuracy']:.1%}",
        }
        for s in settings
    ]


def _human(doc: dict[str, Any]) -> list[Human]:
    names = [s["name"] for s in doc["stages"]]
    columns = [
        "setting",
        *(f"{n} decides" for n in names),
        "no label",
        "cost / 1k posts",
        "macro-F1 [95% CI]",
        "accuracy",
    ]
    stages = ", ".join(
        f"{s['name']} ({s['dialect']} {s['model']}: {s['calls_this_run']} call(s) this run)"
        for s in doc["stages"]
    )
    out: list[Human] = [
        f"cascade {doc['cascade']} on {doc['gold']['file']} ({doc['gold']['rows']} rows): "
        f"{stages}; {len(doc['settings'])} settings swept in {doc['seconds']['sweep']:.2f} s",
        table(_rows([doc["own"]], names), columns, title="the file's own setting"),
        table(
            _rows(doc["frontier"], names),
            columns,
            title=f"frontier: {len(doc['frontier'])} of {len(doc['settings'])} settings "
            "(95% percentile bootstrap intervals)",
        ),
    ]
    chosen = doc["chosen"]
    if chosen is not None:
        out.append(
            f"chosen for a macro-F1 lower bound >= {doc['target_macro_f1']:g}: "
            f"{chosen['setting']}: macro-F1 {chosen['macro_f1']:.3f} "
            f"[{chosen['macro_f1_ci95'][0]:.3f}, {chosen['macro_f1_ci95'][1]:.3f}] at "
            f"{_cost(chosen)} per 1,000 posts"
        )
    return out
