"""One name per concept: the names docs/architecture.md's glossary retires appear nowhere in the
package, the tests, the docs, the README or the benches.

The glossary is the list: a name in its "retired names" column is searched for as a word (an
underscore counts as a separator, so ``_verdict_doc`` holds ``verdict``). Wire names users see
stay as they are (the "wire names kept" column): one that spells a retired name is allowed only
as that quoted literal (``"prompt_version"``, a Dagster metadata key), one that contains it
(``moderation_rubric_version``) as itself. Migrations in ``sql/`` are not searched: they must
name the columns they rename, and so must the tests that build a store at an old migration.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_SEARCHED = ("backfill_assets", "backfill_tests", "docs", "bench")
_SUFFIXES = {".py", ".md", ".yaml", ".toml"}
# Tests that create a store at an old migration and insert rows with its column names, and
# this file, which names what it searches for.
_NOT_SEARCHED = {
    "backfill_tests/ledger/test_booked_chunks.py",
    "backfill_tests/ledger/test_key_version_column.py",
    "backfill_tests/test_names.py",
}
_IDENTIFIER = re.compile(r'"?[A-Za-z_][A-Za-z0-9_]*"?')


def _glossary() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text("utf-8")
    start = text.index("## Glossary\n")
    return text[start : text.index("\n## ", start + 1)]


def _columns() -> tuple[set[str], set[str]]:
    """The retired names and the wire names kept, from the glossary's tables."""
    retired: set[str] = set()
    wire: set[str] = set()
    header: list[str] = []
    for line in _glossary().splitlines():
        if not line.startswith("|"):
            header = []
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not header:
            header = cells
            continue
        if "retired names" not in header:
            continue
        row = dict(zip(header, cells, strict=True))
        retired.update(re.findall(r"`([^`]+)`", row["retired names"]))
        wire.update(re.findall(r"`([^`]+)`", row["wire names kept"]))
    return retired, {w for w in wire if _IDENTIFIER.fullmatch(w)}


def _searched_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for folder in _SEARCHED:
        files += [
            p
            for p in sorted((ROOT / folder).rglob("*"))
            if p.suffix in _SUFFIXES and p.is_file() and "__pycache__" not in p.parts
        ]
    return [p for p in files if p.relative_to(ROOT).as_posix() not in _NOT_SEARCHED]


def test_the_glossary_retires_names_and_keeps_wire_names() -> None:
    retired, wire = _columns()
    assert {"prompt_version", "rubric_version", "retry_after_max_s", "verdict"} <= retired
    assert '"prompt_version"' in wire and "moderation_rubric_version" in wire


def test_no_retired_name_appears() -> None:
    retired, wire = _columns()
    word = re.compile(
        r"(?<![A-Za-z0-9])("
        + "|".join(re.escape(n) for n in sorted(retired, key=len, reverse=True))
        + r")(?![A-Za-z0-9])"
    )
    glossary = _glossary()
    found: list[str] = []
    for path in _searched_files():
        text = path.read_text("utf-8")
        if path == ROOT / "docs" / "architecture.md":
            text = text.replace(glossary, "")
        for name in sorted(wire, key=len, reverse=True):
            bare = name.strip('"')
            if name.startswith('"') or bare not in retired:
                text = text.replace(name, "")
        for no, line in enumerate(text.splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{no}: {m}" for m in word.findall(line)]
    assert found == []
