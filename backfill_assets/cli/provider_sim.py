"""``backfill-moderation provider-sim``: the OpenAI-compatible provider simulator, foreground.

The simulator is a development tool outside the product's import graph: it is imported here,
when this command runs, and nowhere else. Its options are parsed by its own parser, so no
other command loads it.
"""

from __future__ import annotations

import argparse
from typing import Any

from backfill_assets.orchestration.settings import Settings

COMMAND = "provider-sim"
HELP = "Serve the OpenAI-compatible provider simulator until SIGINT/SIGTERM."


def add_provider_sim_command(sub: Any) -> None:
    """Register the subcommand; its options are left for ``sim_parser`` (see ``main``)."""
    sp: argparse.ArgumentParser = sub.add_parser(
        COMMAND, help=HELP, description=HELP, add_help=False
    )
    sp.set_defaults(func=cmd_provider_sim, sim_argv=[])


def sim_parser() -> argparse.ArgumentParser:
    """The simulator's own option parser (imports the simulator)."""
    from backfill_assets.providersim import add_cli_arguments

    parser = argparse.ArgumentParser(prog=f"backfill-moderation {COMMAND}", description=HELP)
    add_cli_arguments(parser)
    return parser


def cmd_provider_sim(args: argparse.Namespace, settings: Settings) -> int:
    """Serve; prints ``provider-sim listening on <base_url>`` once the port accepts requests."""
    from backfill_assets.providersim import config_from_args, run_forever

    try:
        ns = sim_parser().parse_args(args.sim_argv)
    except SystemExit as exc:  # --help (0) or a bad option (2), already printed
        return exc.code if isinstance(exc.code, int) else 0
    run_forever(config_from_args(ns), host=ns.host, port=ns.port)
    return 0
