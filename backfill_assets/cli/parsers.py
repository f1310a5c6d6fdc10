"""Building the command line: a command with subcommands (``tenant list``, ``sink ddl``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

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
