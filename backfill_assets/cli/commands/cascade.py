"""``cascade check FILE``: a cascade file checked against the policy in force, before it costs
anything (docs/cascade.md)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from backfill_assets.cli.parsers import command_group
from backfill_assets.cli.tables import emit, table, tell
from backfill_assets.domain.cascade import (
    CascadeInvalid,
    CascadeStage,
    FileProblem,
    cascade_problems,
    load_cascade,
)

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
