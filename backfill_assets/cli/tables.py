"""The CLI's output, the one place it is printed: rich tables and lines on stdout, messages
on stderr, JSON documents.

Text from outside (a file, a provider's answer, a row of the store) may hold what a terminal
acts on rather than shows: ESC and CSI sequences that move the cursor or clear the screen, OSC
sequences that set the title or hide a link, a carriage return that overwrites a line. Every
human part printed here passes ``terminal_text`` first; JSON escapes them itself.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

Human = Table | str

# What a terminal acts on rather than shows: C0 controls, DEL, C1 controls (CSI, OSC, ...),
# the Unicode line and paragraph separators, and the marks that reorder a line's characters
# (bidirectional embeddings, overrides and isolates).
_CONTROL = re.compile(r"\r\n|[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\t": r"\t", "\n": r"\n", "\r": r"\r"}


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def terminal_text(text: str, lines: bool = True) -> str:
    """``text`` safe to hand a terminal: each control character written as its escape
    (``\\x1b``, ``\\u202e``), the rest untouched; with ``lines``, line ends are kept."""

    def escaped(match: re.Match[str]) -> str:
        found = match.group()
        if lines and found in ("\n", "\r\n"):
            return found  # a CR right before its LF cannot overwrite anything
        return "".join(_escape(c) for c in found)

    return _CONTROL.sub(escaped, text)


def json_text(doc: Any) -> str:
    """``doc`` as one line of JSON: every control character escaped (DEL too, which JSON
    allows raw), so the document is as safe on a terminal as in a pipe."""
    return json.dumps(doc, sort_keys=True, default=str).replace("\x7f", "\\u007f")


def table(
    rows: Sequence[dict[str, Any]], columns: Sequence[str], title: str | None = None
) -> Human:
    """A table of ``columns`` (numbers right-aligned, ``None`` as ``-``); a note when empty."""
    if not rows:
        return f"{title}: (no rows)" if title else "(no rows)"
    out = Table(
        *(Column(Text(terminal_text(c, lines=False))) for c in columns),
        title=None if title is None else Text(terminal_text(title, lines=False)),
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
            print(terminal_text(part), flush=True)
            continue
        # A pipe or a file has no width: use the table's natural one rather than 80
        # columns, so scripts and logs get whole rows.
        width = None if tty else _natural_width(part)
        Console(file=sys.stdout, width=width, highlight=False).print(part)
    sys.stdout.flush()


def tell(message: str) -> None:
    """Print a message (an error, a warning, a note) on stderr."""
    print(terminal_text(message), file=sys.stderr, flush=True)


def show_csv(text: str) -> None:
    """Print CSV text on stdout as it is (its line ends kept), control characters in its
    cells escaped."""
    sys.stdout.write(terminal_text(text))
    sys.stdout.flush()


def show_json(doc: Any) -> None:
    """Print ``doc`` on stdout as one line of JSON."""
    print(json_text(doc), flush=True)


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
    return Text(terminal_text(str(value), lines=False))


def emit(args: argparse.Namespace, doc: Any, *human: Human) -> None:
    """Print ``doc`` as JSON with ``--json``, else the human parts (tables and lines)."""
    if args.json:
        show_json(doc)
    else:
        show(*human)
