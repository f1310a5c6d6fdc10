"""The model's label and the moderator's for each decided post, counted in SQL (the figures:
``domain/policy/agreement.py``).

A pair is a post with a decision about its current text and a result of the model under the
decision's policy version (``decisions.key_version``: the registered key version of that
version) for that same text. The moderator's label is the newest decision about the post
under the policy id (newest ``decided_at``, then ``decision_key``, as the precedence reads
them), whichever version it was decided under. The rows are grouped in the store: what comes
back is a count per tenant, policy version and pair of labels, a few rows however many
decisions there are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.domain.policy.agreement import Pairs
from backfill_assets.ledger.tables import decisions, posts, results


@dataclass(frozen=True, slots=True)
class PairCount:
    """Posts of a tenant whose model label under ``policy_version`` is ``model_label`` and
    whose newest decision says ``human_label``."""

    tenant_id: str
    policy_version: str
    key_version: str
    model_label: str
    human_label: str
    posts: int


def newest_decisions(
    policy_id: str, tenant_ids: Sequence[str] | None = None, text: bool = False
) -> sa.Subquery:
    """The newest decision per post under ``policy_id`` (of ``tenant_ids``; None: all), about
    the post's current text, with the post's slice (and ``text``: its text): one row per
    decided post."""
    d = decisions
    rank = (
        sa.func.row_number()
        .over(
            partition_by=(d.c.tenant_id, d.c.post_id, d.c.policy_id),
            order_by=(d.c.decided_at.desc(), d.c.decision_key.desc()),
        )
        .label("rank")
    )
    ranked = sa.select(
        d.c.tenant_id,
        d.c.post_id,
        d.c.policy_version,
        d.c.key_version,
        d.c.label,
        d.c.rule_ids,
        d.c.decided_at,
        d.c.content_hash,
        rank,
    ).where(d.c.policy_id == policy_id)
    if tenant_ids is not None:
        ranked = ranked.where(d.c.tenant_id.in_(list(tenant_ids)))
    r = ranked.subquery("ranked")
    current = sa.and_(
        posts.c.tenant_id == r.c.tenant_id,
        posts.c.post_id == r.c.post_id,
        posts.c.content_hash == r.c.content_hash,
    )
    return (
        sa.select(
            *(c for c in r.c if c.name != "rank"),
            posts.c.slice,
            *((posts.c.text,) if text else ()),
        )
        .select_from(r.join(posts, current))
        .where(r.c.rank == 1)
        .subquery("newest")
    )


def agreement_pairs(
    conn: Connection,
    policy_id: str,
    model: str,
    task_version: str,
    tenant_ids: Sequence[str] | None = None,
    key_version: str | None = None,
) -> list[PairCount]:
    """The (model label, moderator's label) counts per tenant and policy version of the posts
    that have both, for ``model`` (the configured one; a cascade's composed label under
    ``cascade``); ``key_version``: only decisions under that registered version."""
    n = newest_decisions(policy_id, tenant_ids)
    r = results
    # The results index leads with (tenant, slice, post, text, model, key version, task).
    answered = sa.and_(
        r.c.tenant_id == n.c.tenant_id,
        r.c.slice == n.c.slice,
        r.c.post_id == n.c.post_id,
        r.c.content_hash == n.c.content_hash,
        r.c.model == model,
        r.c.key_version == n.c.key_version,
        r.c.task_version == task_version,
    )
    cols = (n.c.tenant_id, n.c.policy_version, n.c.key_version, r.c.label, n.c.label)
    query = (
        sa.select(*cols, sa.func.count().label("posts"))
        .select_from(n.join(r, answered))
        .group_by(*cols)
        .order_by(*cols)
    )
    if key_version is not None:
        query = query.where(n.c.key_version == key_version)
    return [
        PairCount(str(t), str(pv), str(kv), str(m), str(h), int(c))
        for t, pv, kv, m, h, c in conn.execute(query)
    ]


def pairs_by_tenant(found: Sequence[PairCount]) -> dict[str, Pairs]:
    """Each tenant's (model label, moderator's label) -> posts, over the versions in ``found``
    (``agreement_pairs`` of one key version gives one version's)."""
    out: dict[str, dict[tuple[str, str], int]] = {}
    for p in found:
        pairs = out.setdefault(p.tenant_id, {})
        key = (p.model_label, p.human_label)
        pairs[key] = pairs.get(key, 0) + p.posts
    return dict(out)
