"""Dagster's private modules are imported in one place only (accelerators/dagster_private.py),
where each name has its reason; an upgrade that moves one breaks that module, not ten."""

from __future__ import annotations

import ast
from pathlib import Path

import backfill_assets

PACKAGE = Path(backfill_assets.__file__).parent
ALLOWED = PACKAGE / "accelerators" / "dagster_private.py"


def test_only_dagster_private_imports_from_dagster_underscore_modules() -> None:
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            if any(n.startswith("dagster._") for n in names) and path != ALLOWED:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert found == []
