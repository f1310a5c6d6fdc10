"""The review queue: the posts a person should look at, for ``review export`` and the UI's
``review_queue`` asset.

A post is queued under a policy id when the label in force for its current text
(``applied_labels``) is the model's and at least one of these holds:

- ``decision_outdated``: a moderator decided about this text under this policy id, yet the
  model's label is in force. Precedence (``precedence.py``) lets that happen only when the
  version in force lacks the decision's label or one of its rules: the post went back to review.
- ``action_review``: the policy gives the label the action ``review``.
- ``below_threshold``: the label's probability (``results.p_label``) is under the threshold
  asked for (a label without one is never under it).

A row names one reason, the first of these that holds, in this order. A post whose label in
force is a decision (``source`` ``human``) is never queued, so a decision imported for a queued
post takes it out of the next export. Only labels of a post's current text count: an edited
post waits for its new label, as in ``export``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.domain.policy.document import Policy
from backfill_assets.ledger.tables import applied_labels, decisions, posts, results

REASONS = ("decision_outdated", "action_review", "below_threshold")
# ``source`` of a model row, as a literal (the column's value, not a bound parameter).
_IS_MODEL = applied_labels.c.source == sa.literal_column("'model'")


@dataclass(frozen=True, slots=True)
class ReviewQueue:
    """What queues a post: the policy id, the labels whose action is ``review`` and the
    probability under which a label is queued too (None: no threshold)."""

    policy_id: str
    review_labels: tuple[str, ...]
    below: float | None = None

    @classmethod
    def of(cls, policy: Policy, below: float | None = None) -> ReviewQueue:
        """The queue of ``policy``'s id, by the actions ``policy`` gives its labels."""
        labels = tuple(label.id for label in policy.doc.labels if label.action == "review")
        return cls(policy.policy_id, labels, below)


@dataclass(frozen=True, slots=True)
class ReviewRow:
    """One queued post."""

    tenant_id: str
    post_id: str
    text: str
    label: str
    rule_ids: tuple[str, ...]
    # The model's confidence and the label's probability (None: the wire gave none).
    confidence: float | None
    p_label: float | None
    policy_version: str
    source: str
    reason: str
    labelled_at: str


@dataclass(frozen=True, slots=True)
class TenantQueue:
    """A tenant's queued posts and when the oldest of them was applied (naive UTC)."""

    tenant_id: str
    queued: int
    oldest_applied_at: dt.datetime


def _decided() -> sa.ColumnElement[bool]:
    """A decision about the row's text under its policy id (``decisions_by_post`` serves it)."""
    al, d = applied_labels, decisions
    return sa.exists().where(
        d.c.tenant_id == al.c.tenant_id,
        d.c.post_id == al.c.post_id,
        d.c.policy_id == al.c.policy_id,
        d.c.content_hash == al.c.content_hash,
    )


def _below(queue: ReviewQueue) -> sa.ColumnElement[bool]:
    if queue.below is None:
        return sa.false()
    return results.c.p_label < queue.below


def _from(queue: ReviewQueue) -> sa.ColumnElement[bool]:
    """The joins and conditions every queue query shares."""
    al = applied_labels
    return sa.and_(
        al.c.policy_id == queue.policy_id,
        _IS_MODEL,
        sa.or_(_decided(), al.c.label.in_(queue.review_labels), _below(queue)),
    )


def _joined(*columns: Any, scores: bool = True) -> sa.Select[Any]:
    """``applied_labels`` with its post's current text, and with ``scores`` its result."""
    al, p, r = applied_labels, posts, results
    stmt = (
        sa.select(*columns)
        .select_from(al)
        .join(
            p,
            sa.and_(
                p.c.tenant_id == al.c.tenant_id,
                p.c.post_id == al.c.post_id,
                p.c.content_hash == al.c.content_hash,
            ),
        )
    )
    return stmt.outerjoin(r, r.c.key == al.c.result_key) if scores else stmt


def _reason(queue: ReviewQueue) -> sa.ColumnElement[str]:
    return sa.case(
        (_decided(), sa.literal("decision_outdated")),
        (applied_labels.c.label.in_(queue.review_labels), sa.literal("action_review")),
        else_=sa.literal("below_threshold"),
    )


def review_rows(
    conn: Connection, tenant_id: str, queue: ReviewQueue, batch_rows: int = 5_000
) -> Iterator[ReviewRow]:
    """``tenant_id``'s queued posts in post order (a server-side cursor on PostgreSQL: memory
    is bounded by ``batch_rows``)."""
    al, p, r = applied_labels, posts, results
    stmt = (
        _joined(
            al.c.post_id,
            p.c.text,
            al.c.label,
            al.c.rule_ids,
            r.c.confidence,
            r.c.p_label,
            al.c.policy_version,
            al.c.source,
            _reason(queue).label("reason"),
            r.c.created_at,
            al.c.applied_at,
        )
        .where(al.c.tenant_id == tenant_id, _from(queue))
        .order_by(al.c.post_id)
    )
    streaming = conn.execution_options(stream_results=True, yield_per=batch_rows)
    for row in streaming.execute(stmt):
        labelled: dt.datetime = row.created_at or row.applied_at
        yield ReviewRow(
            tenant_id=tenant_id,
            post_id=row.post_id,
            text=row.text,
            label=row.label,
            rule_ids=tuple(x for x in row.rule_ids.split(",") if x),
            confidence=None if row.confidence is None else float(row.confidence),
            p_label=None if row.p_label is None else float(row.p_label),
            policy_version=row.policy_version,
            source=row.source,
            reason=row.reason,
            labelled_at=labelled.isoformat(timespec="seconds") + "Z",
        )


def review_counts(
    conn: Connection, queue: ReviewQueue, tenant_ids: Sequence[str] = ()
) -> list[TenantQueue]:
    """Queued posts per tenant (those of ``tenant_ids``, else all) with the oldest one's
    ``applied_at``: one grouped query, tenants in name order, none without a queued post."""
    al = applied_labels
    stmt = (
        # The results are read for a threshold only: the asset's count never joins them.
        _joined(
            al.c.tenant_id,
            sa.func.count(),
            sa.func.min(al.c.applied_at),
            scores=queue.below is not None,
        )
        .where(_from(queue))
        .group_by(al.c.tenant_id)
        .order_by(al.c.tenant_id)
    )
    if tenant_ids:
        stmt = stmt.where(al.c.tenant_id.in_(list(tenant_ids)))
    return [TenantQueue(str(tenant), int(n), oldest) for tenant, n, oldest in conn.execute(stmt)]
