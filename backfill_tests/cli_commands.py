"""Every command of the CLI, enumerated from its own parser, and a harmless way to call each.

Tests that must hold for every command (no traceback on hostile input, the price asked for
only where it is used) walk ``commands()``, so a command added later is covered without a
change here. A new command whose required arguments this module cannot fill makes those tests
fail, naming the argument: add its value to ``_VALUES``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from backfill_assets.cli import build_parser
from backfill_assets.domain.policy.file import builtin_policy_text
from backfill_tests.conftest import write_jsonl

# Commands that start a server: called with --help only, their options checked by parsing.
SERVERS = {("provider-sim",)}
# Tenants the files below hold, and the region a tenant is moved to.
TENANT = "acme"


@dataclass(frozen=True)
class Command:
    """One command (``("tenant", "set-budget")``) and its parser."""

    path: tuple[str, ...]
    parser: argparse.ArgumentParser

    @property
    def name(self) -> str:
        return " ".join(self.path)

    def actions(self) -> list[argparse.Action]:
        """Every argument that takes a value: options with one, and positionals."""
        return [
            a
            for a in self.parser._actions  # argparse has no public list of a parser's arguments
            if a.nargs != 0 and not isinstance(a, argparse._SubParsersAction | argparse._HelpAction)
        ]


def commands() -> list[Command]:
    """Every command, subcommands spelled out, in the parser's order."""
    found: list[Command] = []

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found.append(Command(path, parser))
        for sub in subs:
            for name, child in sub.choices.items():
                walk(child, (*path, name))

    walk(build_parser(), ())
    return found


@dataclass(frozen=True)
class Files:
    """Harmless inputs in ``root``: posts of ``TENANT``, the built-in policy, a gold set, an
    empty usage report; outputs go under ``root / "out"``."""

    root: Path

    @classmethod
    def make(cls, root: Path) -> Files:
        root.mkdir(parents=True, exist_ok=True)
        write_jsonl(
            root / "posts.jsonl",
            [{"tenant_id": TENANT, "post_id": f"p{i}", "text": f"post {i}"} for i in range(3)],
        )
        (root / "policy.yaml").write_text(builtin_policy_text(), "utf-8")
        (root / "gold.csv").write_text("id,text,label\n1,hello there,ok\n2,buy now,spam\n")
        (root / "report.json").write_text('{"data": []}')
        (root / "baseline.csv").write_text(f"tenant_id,post_id,label\n{TENANT},p0,ok\n")
        return cls(root)

    @property
    def out(self) -> Path:
        """Where commands write (``export --out``, ``demo-data --out``)."""
        return self.root / "out"


# A value for each argument a command requires, by the argument's destination.
def _values(files: Files) -> dict[str, str]:
    return {
        "path": str(files.root / "posts.jsonl"),
        "file": str(files.root / "policy.yaml"),
        "a": str(files.root / "policy.yaml"),
        "b": str(files.root / "policy.yaml"),
        "gold": str(files.root / "gold.csv"),
        "tenant": TENANT,
        "region": "eu",
        "outcome": "schema_rejected",
        "out": str(files.out / "f"),
        "name": "old-classifier",
    }


# What makes a command do something (without it, it only says what is missing).
def _extra(files: Files) -> dict[tuple[str, ...], list[str]]:
    return {
        ("import",): [str(files.root / "posts.jsonl")],
        ("evaluate",): [str(files.root / "gold.csv")],
        ("baseline", "import"): [str(files.root / "baseline.csv")],
        ("launch",): ["--stale"],
        ("tenant", "set-budget"): ["--usd", "5"],
        ("provider-sim",): ["--help"],
    }


def required(cmd: Command) -> list[argparse.Action]:
    """The arguments ``cmd`` cannot run without."""
    return [a for a in cmd.actions() if a.required or (not a.option_strings and a.nargs is None)]


def harmless_argv(cmd: Command, files: Files, leave_out: str | None = None) -> list[str]:
    """``cmd`` with a value for each required argument (but ``leave_out``'s) and what makes
    it act; raises KeyError naming an argument it has no value for."""
    values = _values(files)
    positionals: list[str] = []
    options: list[str] = []
    for action in required(cmd):
        if action.dest == leave_out:
            continue
        if action.dest not in values:
            raise KeyError(f"{cmd.name}: no harmless value for {action.dest} (cli_commands.py)")
        if action.option_strings:
            options += [action.option_strings[0], values[action.dest]]
        else:
            positionals.append(values[action.dest])
    return [*cmd.path, *positionals, *options, *_extra(files).get(cmd.path, [])]
