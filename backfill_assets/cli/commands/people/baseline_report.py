"""``evaluate --against-baseline NAME [--tenant T] [--out DIR]``: the labels in force measured
against a previous classifier's (``baseline import``), per tenant: agreement, Cohen's kappa,
the transitions from the old labels to the new, and the posts whose action changed, written for
review with ``--out`` (one file per tenant, CSV cells neutralised, written privately and
atomically as ``export`` writes)."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from backfill_assets.cli.inputs import known_tenants, known_value
from backfill_assets.cli.tables import Human, emit, table
from backfill_assets.domain.csv_cells import csv_row
from backfill_assets.domain.errors import UserError
from backfill_assets.domain.policy import NO_LABEL
from backfill_assets.domain.ranges import PATH_SHOWN, shown

if TYPE_CHECKING:
    from backfill_assets.config.settings import Settings

# Post ids each direction lists in the report (``--out`` writes them all).
LISTED = 100
OUT_COLUMNS = ["tenant_id", "post_id", "old_label", "new_label", "change", "text"]
SUMMARY_COLUMNS = ["tenant", "posts", "agreement", "kappa", "now flagged", "now passed"]


def cmd_against_baseline(args: argparse.Namespace, settings: Settings) -> int:
    """Compare baseline ``args.against_baseline`` with the labels in force; exit 0, 2 for a
    baseline or tenant the store does not have."""
    from backfill_assets.runner.queries import (
        against_baseline,
        baseline_names,
        baseline_tenants,
        read_tx,
        store_engine,
    )

    for flag in ("policy", "against", "report", "cascade", "from_decisions", "since"):
        if getattr(args, flag, None):
            raise UserError(f"argument --{flag.replace('_', '-')}: not with --against-baseline")
    name = str(args.against_baseline)
    policy = settings.rubric().policy
    engine = store_engine(settings.store)
    with read_tx(engine) as conn:
        known_value([name], baseline_names(conn), "baseline", "--against-baseline")
        held = baseline_tenants(conn, name)
        tenants = known_tenants([args.tenant], held) if args.tenant else held
        out_dir = _out_dir(args.out) if args.out else None
        reports = against_baseline(conn, name, policy, tenants, LISTED)
    doc: dict[str, Any] = {
        "baseline": name,
        "policy": policy.policy_id,
        "tenants": reports,
    }
    if out_dir is not None:
        files = _write(engine, out_dir, args, policy.policy_id, reports)
        doc["out"] = {"dir": str(out_dir), "files": files}
    emit(args, doc, *_human(name, policy.policy_id, reports, doc.get("out")))
    return 0


def _out_dir(given: str) -> Path:
    out = Path(given)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        where = shown(str(out), PATH_SHOWN)
        raise UserError(f"argument --out: cannot create {where} ({type(exc).__name__})") from None
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _human(
    name: str, policy: str, reports: list[dict[str, Any]], out: dict[str, Any] | None
) -> list[Human]:
    rows = [
        {
            "tenant": r["tenant"],
            "posts": r["posts"],
            "agreement": _pct(r["agreement"]),
            "kappa": "-" if r["kappa"] is None else f"{r['kappa']:.3f}",
            "now flagged": r["now_flagged"]["posts"],
            "now passed": r["now_passed"]["posts"],
        }
        for r in reports
    ]
    human: list[Human] = [
        f"baseline {name} against the labels in force under policy {policy}",
        table(rows, SUMMARY_COLUMNS),
    ]
    for r in reports:
        moves = r["transitions"]
        cols = sorted({b for row in moves.values() for b in row}, key=lambda x: (x == NO_LABEL, x))
        matrix = [{"old \\ new": a, **{c: row.get(c, 0) for c in cols}} for a, row in moves.items()]
        human.append(table(matrix, ["old \\ new", *cols], title=f"{r['tenant']}: transitions"))
    if out is not None:
        human.append(f"posts whose action changed: {', '.join(f['file'] for f in out['files'])}")
    return human


def _write(
    engine: Any, out_dir: Path, args: argparse.Namespace, policy_id: str, reports: list[Any]
) -> list[dict[str, Any]]:
    """One file a tenant: its posts the new labels act on that the old passed, then the
    reverse, each in post order (streamed: a tenant's posts are never all in memory)."""
    from backfill_assets.runner.queries import moved_posts, read_tx

    files = []
    for report in reports:
        tenant = report["tenant"]
        path = out_dir / f"{tenant}.{args.out_format}"

        def rows(conn: Any, tenant: str = tenant, report: Any = report) -> Iterator[dict[str, Any]]:
            for change in ("now_flagged", "now_passed"):
                olds, news = report[change]["old_labels"], report[change]["new_labels"]
                found = moved_posts(conn, args.against_baseline, policy_id, tenant, olds, news)
                for post_id, old, new, text in found:
                    yield {
                        "tenant_id": tenant,
                        "post_id": post_id,
                        "old_label": old,
                        "new_label": new,
                        "change": change,
                        "text": text,
                    }

        with read_tx(engine) as conn:
            written = _atomic(path, rows(conn), args.out_format)
        files.append({"tenant": tenant, "file": path.name, "rows": written})
    return files


def _atomic(path: Path, rows: Iterable[dict[str, Any]], fmt: str) -> int:
    """Through a temporary file (owner-only, as ``mkstemp`` makes it) renamed into place;
    returns the rows written."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            n = _csv(rows, out) if fmt == "csv" else _jsonl(rows, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n


def _csv(rows: Iterable[dict[str, Any]], out: IO[bytes]) -> int:
    text = io.TextIOWrapper(out, encoding="utf-8", newline="", write_through=True)
    writer = csv.DictWriter(text, fieldnames=OUT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    n = 0
    for row in rows:
        writer.writerow(csv_row(row))
        n += 1
    text.flush()
    text.detach()
    return n


def _jsonl(rows: Iterable[dict[str, Any]], out: IO[bytes]) -> int:
    n = 0
    for row in rows:
        out.write(json.dumps(row, sort_keys=True, ensure_ascii=False).encode("utf-8") + b"\n")
        n += 1
    return n
