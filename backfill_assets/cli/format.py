"""Plain-text tables for the CLI's human output."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Left-aligned text columns, numbers right-aligned."""
    if not rows:
        return "(no rows)"
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    numeric = [all(isinstance(r.get(c), int | float) for r in rows) for c in columns]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ).rstrip()

    out = [line(list(columns)), line(["-" * w for w in widths])]
    out += [line(row) for row in cells]
    return "\n".join(out)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
