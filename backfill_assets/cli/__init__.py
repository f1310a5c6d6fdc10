"""``backfill-moderation``: import, rejects, run, verify, check, launch, tenant, usage, ...

Start-up follows the command: building the parser loads argparse, the command modules and the
pure domain only. A command loads what it uses when it runs: the settings once the arguments
parse, SQLAlchemy with the ledger queries (``runner.queries``), Dagster and the provider stack
with the runner (``runner.api``). ``--help``, ``policy``, ``tenant list``, ``rejects`` and
``export`` never load Dagster or the provider stack (``backfill_tests/cli/test_startup.py``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from backfill_assets.cli.commands import store as commands
from backfill_assets.cli.commands.cascade import add_cascade_commands
from backfill_assets.cli.commands.evaluate import add_evaluate_command
from backfill_assets.cli.commands.export import FORMATS, cmd_export
from backfill_assets.cli.commands.ingest import add_ingest_commands
from backfill_assets.cli.commands.operator import add_operator_commands
from backfill_assets.cli.commands.people.baseline import add_baseline_commands
from backfill_assets.cli.commands.people.decisions import add_decisions_commands
from backfill_assets.cli.commands.people.review import add_review_commands
from backfill_assets.cli.commands.policy import add_policy_commands
from backfill_assets.cli.commands.provider_sim import COMMAND as PROVIDER_SIM
from backfill_assets.cli.commands.provider_sim import add_provider_sim_command
from backfill_assets.cli.commands.sink import add_sink_commands
from backfill_assets.cli.commands.tenants import add_tenant_commands
from backfill_assets.cli.inputs import choice, slice_key
from backfill_assets.cli.numbers import count, deadline, margin_share
from backfill_assets.cli.parsers import lazy
from backfill_assets.cli.process import exit_process, freeze_heap
from backfill_assets.cli.tables import tell
from backfill_assets.domain.errors import UserError
from backfill_assets.domain.urls import redact_url, scrub
from backfill_assets.ledger.private_files import private_umask


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

    add_ingest_commands(add)

    sp = add("run", "Materialise moderation_labels for the matching partitions through Dagster.")
    sp.add_argument("--tenant", action="append", default=[], help="tenant id (repeatable)")
    sp.add_argument(
        "--slice", action="append", default=[], type=slice_key, help="s03 or 3 (repeatable)"
    )
    sp.add_argument(
        "--force",
        action="store_true",
        help="run every partition that holds posts, even those with nothing to do",
    )
    sp.add_argument(
        "--sample",
        type=count(1, 10**6),
        metavar="N",
        help="canary: label N posts per tenant (1 to 1,000,000, chosen by key hash) and print "
        "their label shares beside the live column's; the full run later re-pays none of them",
    )
    sp.add_argument(
        "--tier",
        choices=["standard", "flex"],
        help="the synchronous tier to send at (default: BACKFILL_SERVICE_TIER, else standard); "
        "flex is OpenAI's slower tier at the Batch API's price",
    )
    sp.add_argument(
        "--deadline",
        type=deadline,
        metavar="WHEN",
        help="plan the least-cost mix of batch, flex and standard that ends by WHEN "
        "(ISO time such as 2026-12-04T09:00Z, or a duration such as 36h; at most 366 days ahead)",
    )
    sp.add_argument(
        "--mode",
        choices=["auto"],
        default="auto",
        help="with --deadline: the planner picks the tiers (the only mode)",
    )
    sp.add_argument(
        "--margin",
        type=margin_share,
        default=0.10,
        metavar="PCT",
        help="with --deadline: share of the time left kept in reserve (default 10%%)",
    )
    sp.add_argument(
        "--best-effort",
        action="store_true",
        help="with --deadline: go on when the deadline cannot be met (else exit 2)",
    )
    sp.add_argument(
        "--dry-run",
        action="store_true",
        help="with --deadline: print the plan and send nothing",
    )
    sp.add_argument(
        "--replan",
        action="store_true",
        help="with --deadline: replace an unfinished plan (by default it is resumed, with "
        "the deadline it was made for)",
    )
    sp.set_defaults(func=lazy("run:cmd_run"))

    sp = add("export", "Write accepted labels to files, one per tenant, with a manifest.")
    sp.add_argument("--format", choices=FORMATS, default="parquet", help="file format")
    sp.add_argument("--out", required=True, metavar="DIR", help="directory for the files")
    sp.add_argument("--tenant", action="append", default=[], help="tenant id (repeatable)")
    sp.add_argument("--policy", metavar="ID", help="only labels made under this policy id")
    sp.set_defaults(func=cmd_export)

    sp = add("verify", "Recompute expected keys from posts and check every stored row.")
    sp.add_argument("--require-complete", action="store_true", help="fail on missing keys too")
    sp.add_argument("--tenant", action="append", default=[], help="limit to tenant (repeatable)")
    sp.set_defaults(func=commands.cmd_verify)

    sp = add("usage", "Tokens, cost and calls per tenant, model and day, from the ledger.")
    sp.add_argument("--csv", action="store_true", help="print CSV (for invoicing)")
    sp.add_argument("--totals", action="store_true", help="per tenant and model, not per day")
    sp.add_argument(
        "--reprice",
        action="store_true",
        help="per tenant and model: the cost booked beside what the same usage would cost "
        "under today's price table (BACKFILL_PRICES)",
    )
    sp.add_argument(
        "--reconcile",
        metavar="FILE",
        help="compare the ledger per model and day with the provider's usage report (OpenAI's "
        "/v1/organization/usage/completions pages, group_by=model; with /v1/organization/costs "
        "pages for cost); lists every difference, exit 1 on any",
    )
    sp.set_defaults(func=commands.cmd_usage)

    sp = add("dry-run", "Keys left to process and estimated tokens per tenant; no model calls.")
    sp.add_argument("--tenant", action="append", default=[], help="limit to tenant (repeatable)")
    sp.add_argument(
        "--policy",
        metavar="FILE",
        help="what this policy file's keys would cost (default: BACKFILL_POLICY_PATH's)",
    )
    sp.set_defaults(func=commands.cmd_dry_run)

    sp = add("requeue", "Clear dead letters of an outcome so the next run sends those keys again.")
    sp.add_argument("--tenant", required=True, help="tenant id")
    outcomes = ["schema_rejected", "transport_rejected", "retry_exhausted"]
    sp.add_argument(
        "--outcome", required=True, type=choice("outcome", outcomes), help=", ".join(outcomes)
    )
    sp.set_defaults(func=commands.cmd_requeue)

    sp = add("migrate", "Apply pending sql/ migrations to the store.")
    sp.set_defaults(func=commands.cmd_migrate)

    sp = add("demo-data", "Write a deterministic synthetic export.")
    sp.add_argument("--out", required=True)
    sp.add_argument("--tenants", type=count(1, 100_000), default=3, help="tenants, 1 to 100,000")
    sp.add_argument(
        "--posts", type=count(0, 10**7), default=200, help="posts per tenant, 0 to 10,000,000"
    )
    sp.add_argument("--no-bad-lines", action="store_true")
    sp.set_defaults(func=commands.cmd_demo_data)

    add_operator_commands(add)
    add_tenant_commands(add)
    add_sink_commands(add)
    add_policy_commands(add)
    add_cascade_commands(add)
    add_evaluate_command(add)
    add_baseline_commands(add)
    add_decisions_commands(add)
    add_review_commands(add)
    add_provider_sim_command(sub)
    return p


# Exit code of a command stopped by SIGTERM or SIGINT (128 + SIGINT, the shell's convention).
INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script: the exit code (2: bad input, named in the message)."""
    private_umask()  # the store, lock files, shards and logs we create: owner only
    parser = build_parser()
    try:
        # The simulator's options are its own (parsed when it runs, see provider_sim.py).
        args, rest = parser.parse_known_args(argv)
        if rest and args.command != PROVIDER_SIM:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
    except SystemExit as exc:  # argparse: --help (0) or a bad argument (2), already printed
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    if args.command == PROVIDER_SIM:
        args.sim_argv = rest
    # Loaded once a command is chosen: --help and a bad argument never pay for it.
    from backfill_assets.config.settings import Settings, SettingsError

    # Orchestrators stop a process with SIGTERM, then SIGKILL after a grace period: treat
    # SIGTERM like Ctrl-C. Inside a Dagster run, Dagster takes both signals over and stops the
    # step; the run is then recorded as canceled (orchestrate.py) and we exit the same way.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    # A non-interactive shell starts background commands with SIGINT ignored. Dagster takes
    # SIGINT over inside a run anyway; between runs (or while `run` waits for its helpers) an
    # ignored SIGINT would be lost, so the command honours it throughout.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # The environment is read here, once, and the commands get the parsed settings. The
        # policy commands read the files they are given, not BACKFILL_POLICY_PATH's.
        if getattr(args, "tier", None):
            # For this command and every helper process it starts.
            os.environ["BACKFILL_SERVICE_TIER"] = args.tier
        settings = Settings.from_env(os.environ, load_policy=args.command != "policy")
        code: int = args.func(args, settings)
    except (SettingsError, UserError) as exc:
        groups = (
            "tenant_command",
            "policy_command",
            "cascade_command",
            "baseline_command",
            "decisions_command",
            "review_command",
        )
        sub = next((getattr(args, g) for g in groups if getattr(args, g, None)), None)
        name = " ".join(filter(None, (args.command, sub)))
        tell(f"backfill-moderation {name}: error: {exc}")
        return 2
    except Exception as exc:
        if not _store_unreachable(exc):
            raise
        # The store cannot be reached (a wrong host, port or password, a server down): one
        # line naming the setting, never the password, never a traceback.
        url = settings.store.url if "settings" in locals() else ""
        first = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or ["?"])[0]
        tell(
            f"backfill-moderation {args.command}: error: cannot use the store "
            f"{redact_url(url)} (BACKFILL_DATABASE_URL): {scrub(first, url)[:300]}"
        )
        return 2
    except KeyboardInterrupt:
        tell(f"backfill-moderation {args.command}: interrupted")
        return INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    return code


def _store_unreachable(exc: Exception) -> bool:
    """A connection the store refused or lost. SQLAlchemy is loaded only by the commands that
    open the store; where it is not loaded, no such error can have been raised."""
    sa_exc = sys.modules.get("sqlalchemy.exc")
    return sa_exc is not None and isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError))


def console_script() -> NoReturn:
    """The ``backfill-moderation`` command: its imports exempted from garbage collection,
    ``main``, then the end of the process without the interpreter's teardown (``process``)."""
    freeze_heap()
    exit_process(main())
