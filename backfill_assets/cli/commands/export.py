"""``export``: accepted labels as files, one per tenant, with a manifest of counts and hashes.

A file holds one tenant's rows and nothing else; it is written to a temporary name in the same
directory and renamed into place, so a reader never sees half a file. Rows stream from the
store in post order, ``BATCH_ROWS`` at a time, so memory is bounded by a batch. The same store
exported twice into the same directory gives byte-identical files and manifest (no timestamps
of the export itself are written).
"""

from __future__ import annotations

import argparse
import csv
import functools
import hashlib
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict
from itertools import islice
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from backfill_assets.cli.inputs import known_tenants
from backfill_assets.cli.tables import show, show_json, table
from backfill_assets.domain.csv_cells import csv_row
from backfill_assets.domain.errors import UserError
from backfill_assets.domain.ranges import PATH_SHOWN, shown

if TYPE_CHECKING:
    import pyarrow as pa

    from backfill_assets.config.settings import Settings

FORMATS = ("parquet", "csv", "jsonl")
BATCH_ROWS = 5_000
MANIFEST = "manifest.json"
COLUMNS = [
    "tenant_id",
    "post_id",
    "label",
    "rule_ids",
    "confidence",
    "p_label",
    "policy_id",
    "policy_version",
    "policy_identity",
    "model",
    "stage",
    "content_hash",
    "labelled_at",
    "source",
]


@functools.cache
def _schema() -> pa.Schema:
    """The Parquet files' schema (pyarrow loads when a Parquet export runs, not at start-up)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("tenant_id", pa.string()),
            ("post_id", pa.string()),
            ("label", pa.string()),
            ("rule_ids", pa.list_(pa.string())),
            ("confidence", pa.float64()),
            ("p_label", pa.float64()),
            ("policy_id", pa.string()),
            ("policy_version", pa.string()),
            ("policy_identity", pa.string()),
            ("model", pa.string()),
            ("stage", pa.string()),
            ("content_hash", pa.string()),
            ("labelled_at", pa.string()),
            ("source", pa.string()),
        ]
    )


def _batches(rows: Iterable[Any]) -> Iterator[list[Any]]:
    it = iter(rows)
    while batch := list(islice(it, BATCH_ROWS)):
        yield batch


def _write_jsonl(rows: Iterable[Any], out: IO[bytes]) -> int:
    n = 0
    for row in rows:
        doc = {**asdict(row), "rule_ids": list(row.rule_ids)}
        out.write(json.dumps(doc, sort_keys=True, ensure_ascii=False).encode("utf-8") + b"\n")
        n += 1
    return n


def _write_csv(rows: Iterable[Any], out: IO[bytes], columns: Sequence[str] = COLUMNS) -> int:
    text = io.TextIOWrapper(out, encoding="utf-8", newline="", write_through=True)
    writer = csv.DictWriter(text, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    n = 0
    for row in rows:
        # Rule ids are joined with ',' in CSV (a rule id never holds one); text cells that a
        # spreadsheet would run as a formula are quoted (domain/csv_cells.py).
        writer.writerow(csv_row({**asdict(row), "rule_ids": ",".join(row.rule_ids)}))
        n += 1
    text.flush()
    text.detach()
    return n


def _write_parquet(rows: Iterable[Any], out: IO[bytes], schema: pa.Schema | None = None) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = schema or _schema()
    n = 0
    with pq.ParquetWriter(out, schema) as writer:
        for batch in _batches(rows):
            columns: dict[str, list[Any]] = {c: [] for c in schema.names}
            for row in batch:
                for c in schema.names:
                    value = getattr(row, c)
                    columns[c].append(list(value) if c == "rule_ids" else value)
            writer.write_table(pa.table(columns, schema=schema))
            n += len(batch)
        if n == 0:
            writer.write_table(schema.empty_table())
    return n


_WRITERS = {"jsonl": _write_jsonl, "csv": _write_csv, "parquet": _write_parquet}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _atomic(path: Path, write: Any) -> Any:
    """Write through a temporary file in the same directory, then rename it into place."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            result = write(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return result


def write_rows(
    path: Path,
    fmt: str,
    rows: Iterable[Any],
    columns: Sequence[str] = COLUMNS,
    schema: Callable[[], pa.Schema] = _schema,
) -> tuple[int, str]:
    """Write ``rows`` (dataclasses holding ``columns``, ``rule_ids`` a tuple) to ``path`` in
    ``fmt`` as ``export`` writes its files: CSV cells neutralised, Parquet by ``schema``,
    atomically, owner-only. Returns the rows written and the file's sha256 (``review export``
    writes its files through this too)."""
    write: Callable[[IO[bytes]], int]
    if fmt == "csv":
        write = functools.partial(_write_csv, rows, columns=columns)
    elif fmt == "parquet":
        write = functools.partial(_write_parquet, rows, schema=schema())
    else:
        write = functools.partial(_write_jsonl, rows)
    n = _atomic(path, write)
    return int(n), _sha256(path)


def tenants_and_out_dir(args: argparse.Namespace, known: list[str]) -> tuple[list[str], Path]:
    """The tenants ``--tenant`` chose among ``known`` (none: all), then ``--out`` made. Every
    argument is checked before DIR is made: a refused export leaves nothing behind."""
    chosen = sorted(set(known_tenants(args.tenant, known))) or known
    out_dir = Path(args.out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        where = shown(str(out_dir), PATH_SHOWN)
        raise UserError(f"argument --out: cannot create {where} ({type(exc).__name__})") from None
    return chosen, out_dir


def cmd_export(args: argparse.Namespace, settings: Settings) -> int:
    """Write each tenant's accepted labels to ``DIR/<tenant>.<format>`` and a manifest."""
    from backfill_assets.runner.queries import read_tx, store_engine, tenant_ids, tenant_labels

    engine = store_engine(settings.store)
    with read_tx(engine) as conn:
        chosen, out_dir = tenants_and_out_dir(args, tenant_ids(conn))
    write = _WRITERS[args.format]
    files = []
    for tenant in chosen:
        path = out_dir / f"{tenant}.{args.format}"
        with read_tx(engine) as conn:
            labels = tenant_labels(conn, tenant, args.policy)
            rows = _atomic(path, functools.partial(write, labels))
        files.append({"tenant": tenant, "file": path.name, "rows": rows, "sha256": _sha256(path)})
    manifest = {"format": args.format, "policy": args.policy, "files": files}
    body = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode("utf-8")
    _atomic(out_dir / MANIFEST, lambda out: out.write(body))
    doc = {"out": str(out_dir), **manifest}
    total = sum(int(f["rows"]) for f in files)
    if args.json:
        show_json(doc)
    else:
        show(
            table(files, ["tenant", "file", "rows", "sha256"]),
            f"{total} labels in {len(files)} file(s); manifest: {out_dir / MANIFEST}",
        )
    return 0
