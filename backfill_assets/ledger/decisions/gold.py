"""Moderators' decisions as a gold set (``evaluate --from-decisions``): each decided post's
current text with the label of its newest decision and that decision's first rule.

The posts become gold rows of the evaluation tenant (``ingest/gold.py``,
``decided_gold``), named ``<tenant>/<post id>`` so that two tenants' posts of one id stay
two rows and a rerun over the same decisions names the same posts: same keys, nothing paid
again.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.ledger.decisions.agreement import newest_decisions


@dataclass(frozen=True, slots=True)
class DecidedPost:
    """A post with a decision about its current text: the newest one's label and first rule."""

    tenant_id: str
    post_id: str
    text: str
    content_hash: str
    label: str
    rule: str | None

    @property
    def gold_id(self) -> str:
        """The gold row's id: tenant ids hold no ``/``, so it names one tenant's post."""
        return f"{self.tenant_id}/{self.post_id}"


def decided_posts(
    conn: Connection,
    policy_id: str,
    tenant: str | None = None,
    since: dt.datetime | None = None,
    limit: int | None = None,
) -> list[DecidedPost]:
    """The decided posts under ``policy_id`` (of ``tenant``; None: every tenant) whose newest
    decision was made at or after ``since`` (naive UTC), in (tenant, post) order; at most
    ``limit`` of them."""
    n = newest_decisions(policy_id, None if tenant is None else [tenant], text=True)
    query = sa.select(
        n.c.tenant_id, n.c.post_id, n.c.text, n.c.content_hash, n.c.label, n.c.rule_ids
    ).order_by(n.c.tenant_id, n.c.post_id)
    if since is not None:
        query = query.where(n.c.decided_at >= since)
    if limit is not None:
        query = query.limit(limit)
    return [
        DecidedPost(str(t), str(p), str(text), str(h), str(label), _first_rule(str(rules)))
        for t, p, text, h, label, rules in conn.execute(query)
    ]


def _first_rule(rule_ids: str) -> str | None:
    """The first of a decision's rule ids (comma-joined, sorted; '' for none)."""
    first = rule_ids.split(",")[0]
    return first or None


def decided_sha256(found: list[DecidedPost]) -> str:
    """Which decided posts an evaluation was made on: a digest of each row's id, text hash,
    label and rule (the evaluation's ``gold_sha256``, as a gold file's bytes are)."""
    digest = hashlib.sha256()
    for p in found:
        digest.update("\x1f".join((p.gold_id, p.content_hash, p.label, p.rule or "")).encode())
        digest.update(b"\x1e")
    return digest.hexdigest()
