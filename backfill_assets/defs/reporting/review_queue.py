"""review_queue: how many posts wait for a person, per tenant, and how long the oldest has.

What it counts is what ``backfill-moderation review export`` (without ``--below``) writes: the
posts whose model label in force has the action ``review`` under the policy the definitions
loaded, or whose decision the version in force no longer has (``ledger/decisions/review.py``).
One grouped query; refreshed by the daemon after every apply, and on demand.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import dagster as dg

from backfill_assets.config.variables import StoreSettings
from backfill_assets.defs.asset_keys import APPLIED
from backfill_assets.defs.sealing import NO_CONFIG
from backfill_assets.defs.sensors import refresh_condition
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.ledger.decisions.review import ReviewQueue, TenantQueue, review_counts
from backfill_assets.ledger.engine import read_tx
from backfill_assets.ledger.engines import store_engine
from backfill_assets.ledger.tables import utcnow

# The table is for reading in the UI; `review export --json` has every tenant.
MAX_TABLE_ROWS = 100


def age_text(seconds: float) -> str:
    """A wait as a person reads it: ``2d 3h``, ``4h 10m``, ``12m``, ``40s``."""
    s = max(int(seconds), 0)
    days, hours, minutes = s // 86_400, s % 86_400 // 3_600, s % 3_600 // 60
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m" if minutes else f"{s}s"


def queue_table(rows: Sequence[TenantQueue], now: dt.datetime, limit: int = MAX_TABLE_ROWS) -> str:
    """Markdown table of the tenants with the most queued posts first."""
    lines = ["| tenant | queued | oldest waits |", "|---|---:|---:|"]
    longest = sorted(rows, key=lambda r: (-r.queued, r.tenant_id))
    for r in longest[:limit]:
        wait = age_text((now - r.oldest_applied_at).total_seconds())
        lines.append(f"| {r.tenant_id} | {r.queued} | {wait} |")
    if len(rows) > limit:
        lines.append(f"| ... {len(rows) - limit} more: `backfill-moderation review export` | | |")
    if not rows:
        lines.append("| (nothing to review) | | |")
    return "\n".join(lines)


def queue_metadata(
    rows: Sequence[TenantQueue], queue: ReviewQueue, now: dt.datetime
) -> dict[str, dg.MetadataValue]:
    """The asset's metadata: the table, the totals and the oldest wait (0 when none)."""
    oldest = min((r.oldest_applied_at for r in rows), default=None)
    age = 0.0 if oldest is None else max((now - oldest).total_seconds(), 0.0)
    return {
        "queue": dg.MetadataValue.md(queue_table(rows, now)),
        "queued": dg.MetadataValue.int(sum(r.queued for r in rows)),
        "tenants": dg.MetadataValue.int(len(rows)),
        "oldest_age_seconds": dg.MetadataValue.float(age),
        "oldest_age": dg.MetadataValue.text(age_text(age) if oldest is not None else "-"),
        "oldest_applied_at": dg.MetadataValue.text(
            "-" if oldest is None else oldest.isoformat(timespec="seconds") + "Z"
        ),
        "policy_id": dg.MetadataValue.text(queue.policy_id),
        "review_labels": dg.MetadataValue.text(", ".join(queue.review_labels) or "-"),
        "export": dg.MetadataValue.md("`backfill-moderation review export --out review/`"),
    }


def build_review_queue(rubric: Rubric) -> dg.AssetsDefinition:
    """The queue of the policy the definitions loaded (closed over, as the labels')."""
    queue = ReviewQueue.of(rubric.policy)

    @dg.asset(
        config_schema=NO_CONFIG,
        name="review_queue",
        group_name="reporting",
        deps=[APPLIED],
        kinds={"sql"},
        automation_condition=refresh_condition(),
    )
    def review_queue(store: dg.ResourceParam[StoreSettings]) -> dg.MaterializeResult[None]:
        """Posts waiting for a person, per tenant, and the age of the oldest."""
        with read_tx(store_engine(store)) as conn:
            rows = review_counts(conn, queue)
        return dg.MaterializeResult(metadata=queue_metadata(rows, queue, utcnow()))

    return review_queue
