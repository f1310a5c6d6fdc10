"""Building the command line: a command with subcommands (``tenant list``, ``sink ddl``), and a
command whose module is imported only when it runs."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backfill_assets.config.settings import Settings

# A command: parsed arguments and the settings in, the exit code out.
Command = Callable[[argparse.Namespace, "Settings"], int]

# Adds a command (name, help) and returns its parser.
Add = Callable[[str, str], argparse.ArgumentParser]


def command_group(add: Add, name: str, help_: str, dest: str) -> Add:
    """Register ``name`` as a group of subcommands (the chosen one lands in ``dest``); returns
    the function that adds one. Each takes ``--json``."""
    group = add(name, help_)
    sub = group.add_subparsers(dest=dest, required=True, metavar="SUBCOMMAND")

    def child(sub_name: str, sub_help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(sub_name, help=sub_help, description=sub_help)
        # SUPPRESS: a --json given before the subcommand (``tenant --json list``) still counts.
        sp.add_argument(
            "--json",
            action="store_true",
            default=argparse.SUPPRESS,
            help="print JSON instead of a table",
        )
        return sp

    return child


def lazy(target: str) -> Command:
    """The command ``module:function`` of ``cli/commands/``, its module imported when it runs:
    a module that loads Dagster at its top (``run``) costs the other commands nothing."""
    module, name = target.split(":")

    def command(args: argparse.Namespace, settings: Settings) -> int:
        found: Command = getattr(
            importlib.import_module(f"backfill_assets.cli.commands.{module}"), name
        )
        return found(args, settings)

    command.__name__ = name
    return command
