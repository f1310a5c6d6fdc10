"""``review export``: the review queue as files, one per tenant, in the formats of ``export``.

A tenant's file holds the posts a person should look at (``ledger/decisions/review.py`` says
which and why), streamed from the store in post order a batch at a time and written as
``export`` writes (CSV cells neutralised, atomically, owner-only). Every chosen tenant gets a
file, an empty one when nothing of it is queued, so a file of an earlier export never outlives
the queue it showed.
"""

from __future__ import annotations

import argparse
import functools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from backfill_assets.cli.commands.export import FORMATS, tenants_and_out_dir, write_rows
from backfill_assets.cli.numbers import share
from backfill_assets.cli.parsers import command_group
from backfill_assets.cli.tables import emit, table

if TYPE_CHECKING:
    import pyarrow as pa

    from backfill_assets.config.settings import Settings

COLUMNS = [
    "tenant_id",
    "post_id",
    "text",
    "label",
    "rule_ids",
    "confidence",
    "p_label",
    "policy_version",
    "source",
    "reason",
    "labelled_at",
]


@functools.cache
def _schema() -> pa.Schema:
    """The Parquet files' schema (pyarrow loads when a Parquet export runs)."""
    import pyarrow as pa

    types = {"rule_ids": pa.list_(pa.string()), "confidence": pa.float64(), "p_label": pa.float64()}
    return pa.schema([(c, types.get(c, pa.string())) for c in COLUMNS])


def add_review_commands(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Register the ``review`` group: ``export``."""
    child = command_group(
        add, "review", "The review queue: the posts a person should look at.", "review_command"
    )
    sp = child(
        "export",
        "Write the review queue to files, one per tenant: posts whose label in force has the "
        "action review, is under --below, or went back to review after a decision.",
    )
    sp.add_argument("--out", required=True, metavar="DIR", help="directory for the files")
    sp.add_argument("--format", choices=FORMATS, default="csv", help="file format (default csv)")
    sp.add_argument("--tenant", action="append", default=[], help="tenant id (repeatable)")
    sp.add_argument(
        "--below",
        type=share("a probability"),
        metavar="P",
        help="also queue the model's labels whose probability (p_label) is under P (0 to 1)",
    )
    sp.set_defaults(func=cmd_review_export)


def _counted(rows: Iterable[Any], reasons: Counter[str]) -> Iterator[Any]:
    for row in rows:
        reasons[row.reason] += 1
        yield row


def cmd_review_export(args: argparse.Namespace, settings: Settings) -> int:
    """Write each tenant's queued posts to ``DIR/<tenant>.<format>``."""
    from backfill_assets.runner.queries import (
        REVIEW_REASONS,
        ReviewQueue,
        read_tx,
        review_rows,
        store_engine,
        tenant_ids,
    )

    policy = settings.rubric().policy
    queue = ReviewQueue.of(policy, args.below)
    engine = store_engine(settings.store)
    with read_tx(engine) as conn:
        chosen, out_dir = tenants_and_out_dir(args, tenant_ids(conn))
    files: list[dict[str, Any]] = []
    for tenant in chosen:
        path = out_dir / f"{tenant}.{args.format}"
        reasons: Counter[str] = Counter()
        with read_tx(engine) as conn:
            rows = _counted(review_rows(conn, tenant, queue), reasons)
            n, digest = write_rows(path, args.format, rows, COLUMNS, _schema)
        files.append(
            {
                "tenant": tenant,
                "file": str(path),
                "rows": n,
                "sha256": digest,
                **{r: reasons[r] for r in REVIEW_REASONS},
            }
        )
    total = sum(int(f["rows"]) for f in files)
    doc = {
        "out": str(out_dir),
        "format": args.format,
        "policy_id": policy.policy_id,
        "policy_version": policy.version,
        "review_labels": list(queue.review_labels),
        "below": args.below,
        "files": files,
        "total": total,
    }
    emit(
        args,
        doc,
        table(files, ["tenant", "file", "rows", *REVIEW_REASONS]),
        f"{total} queued post(s) of policy {policy.policy_id} in {len(files)} file(s)",
    )
    return 0
