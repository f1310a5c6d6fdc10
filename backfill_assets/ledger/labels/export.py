"""The accepted labels of one tenant, for ``export``: streamed in key order, bounded by a batch.

Only results for a post's current text are exported (the result's content hash is the post's),
each with the policy version it was labelled under.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.ledger.tables import policy_versions, posts, results


@dataclass(frozen=True, slots=True)
class LabelRow:
    """One exported label."""

    tenant_id: str
    post_id: str
    label: str
    rule_ids: tuple[str, ...]
    confidence: float
    # The chosen label's probability from the wire (None: none was given).
    p_label: float | None
    policy_id: str | None
    policy_version: str | None
    policy_identity: str | None
    model: str
    # A cascade's label: the stage that decided it (None for one model's labels).
    stage: str | None
    content_hash: str
    labelled_at: str


def tenant_labels(
    conn: Connection, tenant_id: str, policy_id: str | None = None, batch_rows: int = 5_000
) -> Iterator[LabelRow]:
    """``tenant_id``'s accepted labels of current texts, ordered by post and key (a server-side
    cursor on PostgreSQL: memory is bounded by ``batch_rows``)."""
    r, p, pv = results, posts, policy_versions
    stmt = (
        sa.select(
            r.c.post_id,
            r.c.label,
            r.c.rule_ids,
            r.c.confidence,
            r.c.p_label,
            pv.c.policy_id,
            pv.c.version,
            pv.c.identity,
            r.c.model,
            r.c.stage,
            r.c.content_hash,
            r.c.created_at,
        )
        .join(
            p,
            sa.and_(
                p.c.tenant_id == r.c.tenant_id,
                p.c.post_id == r.c.post_id,
                p.c.content_hash == r.c.content_hash,
            ),
        )
        .outerjoin(pv, pv.c.key_version == r.c.key_version)
        .where(r.c.tenant_id == tenant_id)
        .order_by(r.c.post_id, r.c.key)
    )
    if policy_id is not None:
        stmt = stmt.where(pv.c.policy_id == policy_id)
    streaming = conn.execution_options(stream_results=True, yield_per=batch_rows)
    for row in streaming.execute(stmt):
        yield LabelRow(
            tenant_id=tenant_id,
            post_id=row.post_id,
            label=row.label,
            rule_ids=tuple(x for x in row.rule_ids.split(",") if x),
            confidence=float(row.confidence),
            p_label=None if row.p_label is None else float(row.p_label),
            policy_id=row.policy_id,
            policy_version=row.version,
            policy_identity=row.identity,
            model=row.model,
            stage=row.stage,
            content_hash=row.content_hash,
            labelled_at=row.created_at.isoformat(timespec="seconds") + "Z",
        )
