"""Exports of one set of records in every format, and what the store holds after an import."""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.domain.work.records import MAX_TEXT_BYTES
from backfill_assets.ledger.run.posts import ImportSummary

SECRET = "SECRET-POST-TEXT-7781"
COLUMNS = ("tenant_id", "post_id", "text", "region")


def rec(tenant: str, post_id: str, text: str, region: str | None = None) -> dict[str, Any]:
    return {"tenant_id": tenant, "post_id": post_id, "text": text, "region": region}


# Every kind of row all three formats can say: valid ones, an edit in the same file, and
# rows each rule rejects.
RECORDS = [
    rec("acme", "p1", "hello, world"),
    rec("acme", "p2", 'quotes " and\nnewlines\r\nand, commas'),
    rec("globex", "p1", "same post id, other tenant", "eu"),
    rec("Not A Tenant", "p3", SECRET),
    rec("acme", "", SECRET),
    rec("acme", "p" * 201, SECRET),
    rec("acme", "p4", "x" * (MAX_TEXT_BYTES + 1)),
    rec("acme", "p5", "nul\x00" + SECRET),
    rec("globex", "p6", "region moves", "us"),
    rec("acme", "p2", "p2 edited later in the file"),
    rec("initech", "p7", "caf\u0065\u0301 NFC"),
]


def write_jsonl(path: Path, records: Sequence[dict[str, Any]], names: dict[str, str]) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        for r in records:
            row = {names.get(k, k): v for k, v in r.items() if v is not None}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def csv_bytes(records: Sequence[dict[str, Any]], names: dict[str, str]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow([names.get(c, c) for c in COLUMNS])
    for r in records:
        writer.writerow(["" if r[c] is None else r[c] for c in COLUMNS])
    return out.getvalue().encode("utf-8")


def write_parquet(path: Path, records: Sequence[dict[str, Any]], names: dict[str, str]) -> Path:
    table = pa.table({names.get(c, c): [r[c] for r in records] for c in COLUMNS})
    pq.write_table(table, path, row_group_size=4)
    return path


def write_as(
    fmt: str, directory: Path, records: Sequence[dict[str, Any]], names: dict[str, str]
) -> Path:
    if fmt == "jsonl":
        return write_jsonl(directory / "posts.jsonl", records, names)
    if fmt == "csv":
        path = directory / "posts.csv"
        path.write_bytes(csv_bytes(records, names))
        return path
    if fmt == "csv.gz":
        path = directory / "posts.csv.gz"
        path.write_bytes(gzip.compress(csv_bytes(records, names)))
        return path
    return write_parquet(directory / "posts.parquet", records, names)


def stored(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.text(
                    "SELECT tenant_id, post_id, content_hash, slice, text FROM posts"
                    " ORDER BY tenant_id, post_id"
                )
            )
        ]


def rejects(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.text("SELECT line, reason, tenant_given FROM rejected_records ORDER BY line")
            )
        ]


def counts(s: ImportSummary) -> dict[str, object]:
    return s.as_dict()
