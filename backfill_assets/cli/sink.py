"""``sink ddl`` and ``sink check``: the platform table that ``applied_labels`` writes labels
back into (``BACKFILL_SINK_URL``, ``BACKFILL_SINK_TABLE``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import sqlalchemy as sa

from backfill_assets.cli.commands import emit
from backfill_assets.cli.inputs import UserError
from backfill_assets.orchestration.settings import Settings
from backfill_assets.store.sink import SinkError, check, ddl


def add_sink_commands(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Register the ``sink`` group: ``ddl`` and ``check``."""
    group = add("sink", "The platform table labels are written back into: ddl, check.")
    sub = group.add_subparsers(dest="sink_command", required=True, metavar="SUBCOMMAND")

    def child(name: str, help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
        return sp

    sp = child(
        "ddl",
        "Print CREATE TABLE for BACKFILL_SINK_TABLE, for an operator to review and run "
        "(nothing is created).",
    )
    sp.add_argument(
        "--dialect",
        help="SQL dialect (default: BACKFILL_SINK_URL's, else postgresql)",
    )
    sp.set_defaults(func=cmd_sink_ddl)
    sp = child(
        "check",
        "Check that BACKFILL_SINK_TABLE exists in BACKFILL_SINK_URL with every column and a "
        "unique key on (tenant_id, post_id, policy_id); exit 2 saying what is wrong.",
    )
    sp.set_defaults(func=cmd_sink_check)


def cmd_sink_ddl(args: argparse.Namespace, settings: Settings) -> int:
    """The sink table's DDL for the dialect asked for, or the sink's, or PostgreSQL's."""
    dialect = args.dialect
    if dialect is None and settings.sink_url:
        try:
            dialect = sa.engine.make_url(settings.sink_url).get_backend_name()
        except sa.exc.ArgumentError:
            raise UserError("BACKFILL_SINK_URL is not a database URL") from None
    try:
        text = ddl(settings.sink_table, dialect or "postgresql")
    except ValueError as exc:
        raise UserError(f"argument --dialect: {exc}") from None
    emit(
        args, {"table": settings.sink_table, "dialect": dialect or "postgresql", "ddl": text}, text
    )
    return 0


def cmd_sink_check(args: argparse.Namespace, settings: Settings) -> int:
    """Exit 0 when the sink can be written, else 2 listing every problem."""
    sink = settings.sink()
    if sink is None:
        raise UserError("BACKFILL_SINK_URL is not set: there is no sink to check")
    try:
        problems = check(sink)
    except SinkError as exc:
        raise UserError(str(exc)) from None
    if problems:
        raise UserError(f"{sink.name}: " + "; ".join(problems))
    emit(args, {"sink": sink.name, "ok": True}, f"{sink.name}: OK")
    return 0
