"""The sink table's name and batch defaults, and the rule a table name follows: what the
settings check at start-up, apart from ``sink.py`` so that reading them loads no SQL."""

from __future__ import annotations

import re

DEFAULT_TABLE = "moderation_labels"
DEFAULT_BATCH = 5000
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def split_table_name(name: str) -> tuple[str | None, str]:
    """``schema.table`` or ``table``, each a plain SQL identifier; ValueError otherwise."""
    parts = name.split(".")
    if len(parts) > 2 or not all(_IDENT.fullmatch(p) for p in parts):
        raise ValueError(
            f"{name[:80]!r} is not a table name (letters, digits and _, optionally schema.table)"
        )
    return (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])
