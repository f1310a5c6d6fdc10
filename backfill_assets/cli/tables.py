"""The CLI's human output: rich tables and lines on stdout (JSON is printed by the caller)."""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

Human = Table | str


def table(
    rows: Sequence[dict[str, Any]], columns: Sequence[str], title: str | None = None
) -> Human:
    """A table of ``columns`` (numbers right-aligned, ``None`` as ``-``); a note when empty."""
    if not rows:
        return f"{title}: (no rows)" if title else "(no rows)"
    out = Table(
        *(Column(Text(c)) for c in columns),
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        header_style="bold",
        pad_edge=False,
    )
    for i, c in enumerate(columns):
        if all(_is_number(r.get(c)) for r in rows):
            out.columns[i].justify = "right"
    for r in rows:
        out.add_row(*(_cell(r.get(c)) for c in columns))
    return out


def show(*parts: Human) -> None:
    """Print tables and lines to stdout: styled on a terminal, plain and unwrapped otherwise."""
    tty = sys.stdout.isatty()
    for part in parts:
        if isinstance(part, str):
            print(part, flush=True)
            continue
        # A pipe or a file has no width: use the table's natural one rather than 80
        # columns, so scripts and logs get whole rows.
        width = None if tty else _natural_width(part)
        Console(file=sys.stdout, width=width, highlight=False).print(part)
    sys.stdout.flush()


def _natural_width(part: Table) -> int:
    wide = Console(width=10_000, file=io.StringIO())
    return max(wide.measure(part).maximum, 20)


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _cell(value: Any) -> Text:
    # Text, not str: a value such as a regex in a reject reason is not rich markup.
    if value is None:
        return Text("-")
    if isinstance(value, float):
        return Text(f"{value:.6g}")
    return Text(str(value))


def emit(args: argparse.Namespace, doc: Any, *human: Human) -> None:
    """Print ``doc`` as JSON with ``--json``, else the human parts (tables and lines)."""
    if args.json:
        print(json.dumps(doc, sort_keys=True, default=str), flush=True)
    else:
        show(*human)
