"""``export``: one file per tenant holding only its rows, matching the store, atomically
written, byte-identical on a rerun, with a manifest of counts and hashes."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import main
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import run

TENANTS = ("acme", "globex", "initech")


@pytest.fixture
def labelled(engine: Engine, cli_store: dict[str, str], tmp_path: Path) -> Engine:
    posts = [
        {"tenant_id": t, "post_id": f"p{i:03d}", "text": f'{t} says hello {i}, with "quotes"'}
        for t in TENANTS
        for i in range(25 if t != "initech" else 3)
    ]
    import_records(engine, tmp_path, posts)
    run(engine, ["acme", "globex"])  # initech is never labelled
    # An edited post: its label was for the old text, so it is not exported.
    import_records(
        engine,
        tmp_path,
        [{"tenant_id": "acme", "post_id": "p000", "text": "edited since it was labelled"}],
        name="edit.jsonl",
    )
    return engine


def _read(path: Path, fmt: str) -> list[dict[str, Any]]:
    if fmt == "parquet":
        return list(pq.read_table(path).to_pylist())
    if fmt == "csv":
        with path.open(newline="") as f:
            return list(csv.DictReader(f))
    return [json.loads(line) for line in path.read_text().splitlines()]


def _store_rows(engine: Engine, tenant: str) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        return [
            (str(p), str(lab))
            for p, lab in conn.execute(
                sa.text(
                    "SELECT r.post_id, r.label FROM results r JOIN posts p"
                    " ON p.tenant_id = r.tenant_id AND p.post_id = r.post_id"
                    " AND p.content_hash = r.content_hash"
                    " WHERE r.tenant_id = :t ORDER BY r.post_id"
                ),
                {"t": tenant},
            )
        ]


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_one_file_per_tenant_matching_the_store_and_identical_on_rerun(
    labelled: Engine, tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["export", "--format", fmt, "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["files"] == doc["files"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"{t}.{fmt}" for t in TENANTS] + ["manifest.json"]
    )  # no temporary file left behind
    for entry in manifest["files"]:
        path = out / entry["file"]
        rows = _read(path, fmt)
        assert {r["tenant_id"] for r in rows} <= {entry["tenant"]}  # never another tenant's
        assert [(r["post_id"], r["label"]) for r in rows] == _store_rows(labelled, entry["tenant"])
        assert entry["rows"] == len(rows)
        assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    counts = {f["tenant"]: f["rows"] for f in manifest["files"]}
    assert counts == {"acme": 24, "globex": 25, "initech": 0}  # acme's p000 was edited
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(["export", "--format", fmt, "--out", str(out)]) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first


def test_tenant_and_policy_filters(
    labelled: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "one"
    assert main(["export", "--format", "jsonl", "--out", str(out), "--tenant", "globex"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["globex.jsonl", "manifest.json"]
    assert main(["export", "--format", "jsonl", "--out", str(out), "--tenant", "nobody"]) == 2
    assert "argument --tenant: unknown tenant 'nobody'" in capsys.readouterr().err
    other = tmp_path / "other-policy"
    argv = ["export", "--format", "jsonl", "--out", str(other), "--policy", "course", "--json"]
    assert main(argv) == 0
    assert all(f["rows"] == 0 for f in json.loads(capsys.readouterr().out)["files"])
