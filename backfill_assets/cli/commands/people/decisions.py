"""``decisions import``: moderators' decisions from exports or a database query, checked
against the policy version they name and the posts in the store, kept, and applied over the
model's labels (docs/data.md, "Decisions in")."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backfill_assets.cli.commands.ingest import bound_tenant, from_sql, rejects_hint
from backfill_assets.cli.inputs import choice
from backfill_assets.cli.parsers import command_group
from backfill_assets.cli.progress import ProgressDisplay, wanted
from backfill_assets.cli.tables import Human, emit, table, tell
from backfill_assets.domain.errors import UserError
from backfill_assets.ingest.formats import FORMATS, Format, ImportInputError

if TYPE_CHECKING:
    from backfill_assets.config.settings import Settings
    from backfill_assets.runner.queries import DecisionOptions, DecisionsSummary

COLUMNS = ["file", "read", "imported", "updated", "unchanged", "rejected", "applied", "held"]


def add_decisions_commands(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Register the ``decisions`` group: ``import``."""
    about = "Moderators' decisions, which outrank the model: import."
    child = command_group(add, "decisions", about, "decisions_command")
    sp = child(
        "import",
        "Import moderators' decisions (JSONL, CSV, Parquet; a file or a directory) or a "
        "query's rows; each applied over the model's label of its post.",
    )
    sp.add_argument(
        "path",
        nargs="?",
        help="a JSONL, CSV (.gz or not) or Parquet file of decisions, or a directory of them",
    )
    sp.add_argument(
        "--format",
        type=choice("format", FORMATS),
        default=None,
        help="jsonl, csv or parquet (default: decided by each file's content)",
    )
    sp.add_argument(
        "--map",
        default=None,
        metavar="FIELD=COLUMN,...",
        help="read fields from other columns: reviewer_id=moderator,decided_at=reviewed_at",
    )
    sp.add_argument(
        "--tenant",
        default=None,
        help="bind the import to one tenant: rows naming another are rejected, rows naming "
        "none are this tenant's",
    )
    sp.add_argument("--sql", default=None, metavar="URL", help="import from this database")
    sp.add_argument("--query", default=None, help="with --sql: the SELECT that returns them")
    sp.add_argument(
        "--source",
        default="decisions",
        metavar="NAME",
        help="with --sql: the source's name in rejects and its mark (default: decisions)",
    )
    sp.add_argument(
        "--cursor",
        default=None,
        metavar="COLUMN",
        help="with --sql: read only rows from the last import's COLUMN value on (that value "
        "again); without it every import reads the whole query, what it read before unchanged",
    )
    sp.set_defaults(func=cmd_decisions_import)


def _options(args: argparse.Namespace) -> DecisionOptions:
    from backfill_assets.runner.queries import DecisionOptions, parse_decision_map

    tenant = bound_tenant(args.tenant)
    sql_only = {"--query": args.query, "--cursor": args.cursor}
    from_sql(args, sql_only, ("--query",), "give a PATH to import, or --sql URL --query ...")
    fmt: Format | None = args.format
    try:
        columns = parse_decision_map(args.map)
    except ImportInputError as exc:
        raise UserError(str(exc)) from None
    return DecisionOptions(columns=columns, tenant=tenant, format=fmt)


def cmd_decisions_import(args: argparse.Namespace, settings: Settings) -> int:
    """Import decisions; rows that cannot be decisions are recorded as rejects."""
    from backfill_assets.runner.queries import (
        DecisionsSummary,
        import_decision_files,
        import_decision_sql,
        store_engine,
    )

    options = _options(args)
    policy = settings.rubric().policy
    engine = store_engine(settings.store)
    with ProgressDisplay("rows", enabled=wanted(args.json)) as display:

        def progress(label: str, s: DecisionsSummary) -> None:
            display.update(label, s.read, imported=s.imported, rejected=s.rejected)

        try:
            mark = None
            if args.sql is not None:
                got = import_decision_sql(
                    engine,
                    args.sql,
                    args.query,
                    args.source,
                    args.cursor,
                    policy,
                    options,
                    progress,
                )
                done, mark = [(f"sql:{args.source}", got.summary)], got.high_water()
            else:
                files = import_decision_files(engine, Path(args.path), policy, options, progress)
                done = [(f.name, s) for f, s in files]
        except ImportInputError as exc:
            raise UserError(str(exc)) from None
    total = DecisionsSummary()
    for _, s in done:
        total.add(s)
    rows = [{"file": name, **_counts(s)} for name, s in done]
    if len(rows) > 1:
        rows.append({"file": f"total ({len(rows)} files)", **_counts(total)})
    human: list[Human] = [table(rows, COLUMNS)]
    if total.applied.held_for_review:
        human.append(
            f"{total.applied.held_for_review} decision(s) held: a newer policy version's label "
            "holds the post and lacks the decided label or a rule; the post is in review"
        )
    doc: dict[str, Any] = total.as_dict()
    if mark is not None:
        doc["high_water"] = mark
        human.append("high-water mark: " + ", ".join(f"{k} {v}" for k, v in mark.items() if v))
    emit(args, doc, *human)
    if total.new_rejects and not args.json:
        tell(rejects_hint(total.new_rejects))
    return 0


def _counts(s: DecisionsSummary) -> dict[str, Any]:
    doc = s.as_dict()
    return {c: doc[c] for c in COLUMNS[1:-1]} | {"held": doc["held_for_review"]}
