"""``backfill-moderation provider-sim``: the OpenAI-compatible provider simulator, foreground.

The simulator is a development tool outside the product's import graph: it is imported here,
when this command runs, and nowhere else. Its options are parsed by its own parser, so no
other command loads it.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from backfill_assets.cli.tables import tell

if TYPE_CHECKING:
    from backfill_assets.config.settings import Settings
    from backfill_assets.providersim import SimConfig

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


def sim_options(argv: list[str]) -> tuple[SimConfig, str, int] | int:
    """The simulator's options read and checked: its config, host and port, or the exit code
    (0 after ``--help``, 2 after a bad option, the message printed)."""
    from pydantic import ValidationError

    from backfill_assets.providersim import config_from_args

    try:
        ns = sim_parser().parse_args(argv)
        return config_from_args(ns), ns.host, ns.port
    except SystemExit as exc:  # --help (0) or a bad option (2), already printed
        return exc.code if isinstance(exc.code, int) else 0
    except ValidationError as exc:  # options that parse but do not make a simulator
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        tell(f"backfill-moderation {COMMAND}: error: {where}: {first['msg']}")
        return 2


def cmd_provider_sim(args: argparse.Namespace, settings: Settings) -> int:
    """Serve; prints ``provider-sim listening on <base_url>`` once the port accepts requests."""
    from backfill_assets.providersim import run_forever

    options = sim_options(args.sim_argv)
    if isinstance(options, int):
        return options
    config, host, port = options
    run_forever(config, host=host, port=port)
    return 0
