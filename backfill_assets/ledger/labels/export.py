"""The accepted labels of one tenant, for ``export``: streamed in key order, bounded by a batch.

Only results for a post's current text are exported (the result's content hash is the post's),
each with the policy version it was labelled under, and the moderators' decisions in force
(``source`` ``human``, model ``human``) beside the model's labels (``source`` ``model``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.ledger.tables import (
    HUMAN,
    MODEL,
    applied_labels,
    decisions,
    policy_versions,
    posts,
    results,
)


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
    # ``human``: a moderator's decision in force; ``model``: a model's label.
    source: str = MODEL


def tenant_labels(
    conn: Connection, tenant_id: str, policy_id: str | None = None, batch_rows: int = 5_000
) -> Iterator[LabelRow]:
    """``tenant_id``'s accepted labels of current texts, ordered by post and key (a server-side
    cursor on PostgreSQL: memory is bounded by ``batch_rows``)."""
    r, p, pv = results, posts, policy_versions
    model = (
        sa.select(
            r.c.post_id,
            r.c.key,
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
            sa.literal(MODEL).label("source"),
        )
        # ``slice`` too, though the post id fixes it: it is the second column of
        # ``results_by_post``. Without it a nested loop (which PostgreSQL picks when its
        # statistics predate the tenant) read the tenant's whole index range for every post:
        # 218 s to export 1,000,000 posts after a tenant-sorted import.
        .join(
            p,
            sa.and_(
                p.c.tenant_id == r.c.tenant_id,
                p.c.slice == r.c.slice,
                p.c.post_id == r.c.post_id,
                p.c.content_hash == r.c.content_hash,
            ),
        )
        .outerjoin(pv, pv.c.key_version == r.c.key_version)
        .where(r.c.tenant_id == tenant_id)
    )
    if policy_id is not None:
        model = model.where(pv.c.policy_id == policy_id)
    both = sa.union_all(model, _decided(tenant_id, policy_id)).subquery()
    stmt = sa.select(both).order_by(both.c.post_id, both.c.key)
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
            labelled_at=_iso(row.created_at),
            source=row.source,
        )


def _iso(value: object) -> str:
    # SQLite hands a union's timestamp back as text.
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    assert isinstance(value, dt.datetime)
    return value.isoformat(timespec="seconds") + "Z"


def _decided(tenant_id: str, policy_id: str | None) -> sa.Select[Any]:
    """The tenant's decisions in force, as rows of the export: certain (confidence 1, no
    probability), labelled when decided, keyed by the decision."""
    al, d, pv = applied_labels, decisions, policy_versions
    stmt = (
        sa.select(
            al.c.post_id,
            al.c.result_key.label("key"),
            al.c.label,
            al.c.rule_ids,
            sa.literal(1.0, sa.Float).label("confidence"),
            sa.null().label("p_label"),
            al.c.policy_id,
            al.c.policy_version.label("version"),
            pv.c.identity,
            al.c.model,
            sa.null().label("stage"),
            al.c.content_hash,
            d.c.decided_at.label("created_at"),
            sa.literal(HUMAN).label("source"),
        )
        .join(d, d.c.decision_key == al.c.result_key)
        .join(
            posts,
            sa.and_(
                posts.c.tenant_id == al.c.tenant_id,
                posts.c.post_id == al.c.post_id,
                posts.c.content_hash == al.c.content_hash,
            ),
        )
        .outerjoin(pv, pv.c.key_version == al.c.key_version)
        .where(al.c.tenant_id == tenant_id, al.c.source == HUMAN)
    )
    return stmt if policy_id is None else stmt.where(al.c.policy_id == policy_id)
