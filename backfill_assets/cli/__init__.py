"""``backfill-moderation``: import, run, verify, check, launch, usage, dry-run, requeue, ..."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ..settings import SettingsError
from . import commands
from .operator import add_operator_commands
from .provider_sim import add_provider_sim_command


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    p = argparse.ArgumentParser(
        prog="backfill-moderation",
        description="Resumable, multi-tenant LLM moderation backfill (Dagster).",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
        return sp

    sp = add("import", "Stream a JSONL export into the posts table.")
    sp.add_argument("path", help="JSONL file: tenant_id/tenantId, post_id/postId, text per line")
    sp.set_defaults(func=commands.cmd_import)

    sp = add("run", "Materialise moderation_labels for the matching partitions through Dagster.")
    sp.add_argument("--tenant", action="append", default=[], help="tenant id (repeatable)")
    sp.add_argument(
        "--slice", action="append", default=[], help="slice, e.g. s03 or 3 (repeatable)"
    )
    sp.set_defaults(func=commands.cmd_run)

    sp = add("verify", "Recompute expected keys from posts and audit every stored row.")
    sp.add_argument("--require-complete", action="store_true", help="fail on missing keys too")
    sp.add_argument("--tenant", action="append", default=[], help="limit to tenant (repeatable)")
    sp.set_defaults(func=commands.cmd_verify)

    sp = add("usage", "Tokens, cost and calls per tenant, model and day, from the ledger.")
    sp.add_argument("--csv", action="store_true", help="print CSV (for invoicing)")
    sp.add_argument("--totals", action="store_true", help="per tenant and model, not per day")
    sp.set_defaults(func=commands.cmd_usage)

    sp = add("dry-run", "Keys left to process and estimated tokens per tenant; no model calls.")
    sp.add_argument("--tenant", action="append", default=[], help="limit to tenant (repeatable)")
    sp.set_defaults(func=commands.cmd_dry_run)

    sp = add("requeue", "Clear dead letters of an outcome so the next run sends those keys again.")
    sp.add_argument("--tenant", required=True, help="tenant id")
    sp.add_argument(
        "--outcome",
        required=True,
        choices=["schema_rejected", "transport_rejected", "retry_exhausted"],
    )
    sp.set_defaults(func=commands.cmd_requeue)

    sp = add("migrate", "Apply pending sql/ migrations to the store.")
    sp.set_defaults(func=commands.cmd_migrate)

    sp = add("demo-data", "Write a deterministic synthetic export.")
    sp.add_argument("--out", required=True)
    sp.add_argument("--tenants", type=int, default=3)
    sp.add_argument("--posts", type=int, default=200, help="posts per tenant")
    sp.add_argument("--no-bad-lines", action="store_true")
    sp.set_defaults(func=commands.cmd_demo_data)

    add_operator_commands(add)
    add_provider_sim_command(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args, dict(os.environ))
    except (SettingsError, commands.UserError) as exc:
        print(f"backfill-moderation: error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
