"""``baseline import``: a previous classifier's results per post (a label, or attribute scores
such as Perspective API's mapped by thresholds) kept under a name for ``evaluate
--against-baseline NAME``; never applied (docs/data.md, "Baselines in")."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backfill_assets.cli.commands.ingest import bound_tenant, from_sql, rejects_hint
from backfill_assets.cli.inputs import choice
from backfill_assets.cli.parsers import Command, command_group
from backfill_assets.cli.tables import Human, emit, table, tell
from backfill_assets.domain.errors import UserError
from backfill_assets.ingest.formats import FORMATS, ImportInputError

if TYPE_CHECKING:
    from backfill_assets.config.settings import Settings
    from backfill_assets.runner.queries import BaselineSummary

COLUMNS = ["source", "read", "imported", "updated", "unchanged", "rejected"]
REJECT_COLUMNS = ["line", "locator", "tenant", "reason"]
# A query's rows read at a time.
ROWS_PER_READ = 2000


def add_baseline_commands(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Register the ``baseline`` group: ``import``."""
    child = command_group(
        add,
        "baseline",
        "A previous classifier's results kept as a baseline, never applied: import.",
        "baseline_command",
    )
    sp = child(
        "import",
        "Import a previous classifier's result per post (a label, or attribute scores mapped "
        "by thresholds) from a JSONL, CSV or Parquet file or a query, as baseline NAME.",
    )
    sp.add_argument("path", nargs="?", help="a JSONL, CSV (.gz or not) or Parquet file")
    sp.add_argument("--name", required=True, help="the baseline's name (such as perspective)")
    sp.add_argument(
        "--format",
        type=choice("format", FORMATS),
        default=None,
        help="jsonl, csv or parquet (default: decided by the file's content)",
    )
    sp.add_argument(
        "--map",
        default=None,
        metavar="FIELD=COLUMN,...",
        help="read fields from other columns: tenant_id=workspace,post_id=id,label=old_label,"
        "scores=perspective",
    )
    sp.add_argument(
        "--tenant",
        default=None,
        help="bind the import to one tenant: rows naming another are rejected, rows naming "
        "none are this tenant's",
    )
    sp.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="ATTR=LABEL:X",
        help="an attribute score at or above X (0 to 1) means LABEL, such as "
        "TOXICITY=abuse:0.8 (repeatable; an attribute may have several labels)",
    )
    sp.add_argument(
        "--mapping",
        metavar="FILE",
        help="a YAML file of thresholds: attributes: {TOXICITY: {abuse: 0.8}, ...}",
    )
    sp.add_argument("--sql", default=None, metavar="URL", help="import from this database")
    sp.add_argument("--query", default=None, help="with --sql: the SELECT that returns the rows")
    sp.set_defaults(func=cmd_baseline_import)


def add_against_baseline(sp: argparse.ArgumentParser) -> None:
    """``evaluate``'s flags of a comparison with a stored baseline."""
    sp.add_argument(
        "--against-baseline",
        metavar="NAME",
        help="no GOLD: per tenant, agreement, Cohen's kappa and transitions from baseline "
        "NAME's labels (`baseline import`) to the labels in force",
    )
    sp.add_argument(
        "--out",
        metavar="DIR",
        help="with --against-baseline: write each tenant's posts whose action changed "
        "(with their text) to DIR/<tenant>.<format>",
    )
    sp.add_argument(
        "--out-format",
        choices=("csv", "jsonl"),
        default="csv",
        help="with --out: csv (default) or jsonl",
    )


def baseline_or(evaluate: Command) -> Command:
    """``evaluate`` with ``--against-baseline`` (no gold set, no model: the store's labels)
    answered by ``baseline_report``; without it, a GOLD set is required."""

    def command(args: argparse.Namespace, settings: Settings) -> int:
        if args.against_baseline is not None:
            if args.gold is not None:
                raise UserError("argument GOLD: not with --against-baseline")
            from backfill_assets.cli.commands.people.baseline_report import cmd_against_baseline

            return cmd_against_baseline(args, settings)
        if args.gold is None and not getattr(args, "from_decisions", False):
            raise UserError("give a GOLD set, or --against-baseline NAME")
        if args.out is not None:
            raise UserError("argument --out: only with --against-baseline")
        return evaluate(args, settings)

    command.__name__ = evaluate.__name__
    return command


def _source(args: argparse.Namespace) -> tuple[str, str] | None:
    """(url, query) of ``--sql``, or ``None`` for a file."""
    hint = "give a PATH to import, or --sql URL --query ..."
    if not from_sql(args, {"--query": args.query}, ("--query",), hint):
        return None
    return str(args.sql), str(args.query)


def cmd_baseline_import(args: argparse.Namespace, settings: Settings) -> int:
    """Import baseline rows from a file or a query; exit 0 (rejected rows are listed)."""
    from backfill_assets.runner.queries import (
        SourceError,
        baseline_options,
        import_baseline_file,
        import_baseline_query,
        query_columns,
        store_engine,
        stream_rows,
    )

    source = _source(args)
    policy = settings.rubric().policy
    try:
        opts = baseline_options(
            args.name, policy, bound_tenant(args.tenant), args.map, args.threshold, args.mapping
        )
    except ImportInputError as exc:
        raise UserError(str(exc)) from None
    engine = store_engine(settings.store)
    try:
        if source is None:
            label = str(Path(args.path))
            summary = import_baseline_file(engine, args.path, args.format, opts)
        else:
            url, query = source
            label = "query"
            names = query_columns(url, query)

            def rows(columns: list[str]) -> Any:
                return stream_rows(url, query, columns, ROWS_PER_READ)

            summary = import_baseline_query(engine, names, rows, opts, label)
    except (ImportInputError, SourceError) as exc:
        raise UserError(str(exc)) from None
    _report(args, summary, label, policy.policy_id)
    return 0


def _report(args: argparse.Namespace, summary: BaselineSummary, label: str, policy: str) -> None:
    rejects = [
        {"line": r.line, "locator": r.locator, "tenant": r.tenant_given, "reason": r.reason}
        for r in summary.rejects
    ]
    doc: dict[str, Any] = {
        "name": args.name,
        "policy": policy,
        "source": label,
        **summary.as_dict(),
        "rejects": rejects,
    }
    human: list[Human] = [
        f"baseline {args.name} (policy {policy})",
        table([{"source": label, **summary.as_dict()}], COLUMNS),
    ]
    if rejects:
        human.append(table(rejects, REJECT_COLUMNS, title="rejected rows (first 100)"))
    emit(args, doc, *human)
    if summary.rejected and not args.json:
        tell(rejects_hint(summary.rejected))
