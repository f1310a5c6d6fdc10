"""``backfill-moderation provider-sim``: the OpenAI-compatible provider simulator, foreground."""

from __future__ import annotations

import argparse
from typing import Any

from ..providersim import add_cli_arguments, config_from_args, run_forever
from ..settings import Settings


def add_provider_sim_command(sub: Any) -> None:
    """Register the subcommand on the CLI's subparsers."""
    help_ = "Serve the OpenAI-compatible provider simulator until SIGINT/SIGTERM."
    sp: argparse.ArgumentParser = sub.add_parser("provider-sim", help=help_, description=help_)
    add_cli_arguments(sp)
    sp.set_defaults(func=cmd_provider_sim)


def cmd_provider_sim(args: argparse.Namespace, settings: Settings) -> int:
    """Serve; prints ``provider-sim listening on <base_url>`` once the port accepts requests."""
    run_forever(config_from_args(args), host=args.host, port=args.port)
    return 0
