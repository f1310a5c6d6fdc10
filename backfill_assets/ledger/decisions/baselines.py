"""Previous classifiers' results kept as baselines (``baselines``, sql/025), and what
``evaluate --against-baseline`` reads of them.

A baseline never outranks anything: nothing here writes ``applied_labels``, the posts' label
columns or the sink. A row is keyed by (name, tenant, post) and holds the post's text hash at
import, so a baseline of a post edited since is not compared with the label of its new text.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.domain.people.baseline_map import BaselineRow, acting
from backfill_assets.domain.policy.agreement import cohen_kappa
from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.policy.evaluation import wilson
from backfill_assets.ledger.dialect import insert_for
from backfill_assets.ledger.tables import applied_labels, baselines, posts, utcnow

# Keys a statement reads or writes at once.
_CHUNK = 500


@dataclass
class BaselineWrites:
    """What a chunk of rows did to ``baselines``; ``missing``: rows naming no stored post."""

    imported: int = 0
    updated: int = 0
    unchanged: int = 0
    missing: list[BaselineRow] = field(default_factory=list)


def upsert_baselines(
    conn: Connection, name: str, policy_id: str, rows: Sequence[BaselineRow]
) -> BaselineWrites:
    """Keyed upsert of ``rows`` under ``name``, in the caller's transaction, counted as if
    written one by one (a later row of the same post updates an earlier one)."""
    out = BaselineWrites()
    for start in range(0, len(rows), _CHUNK):
        _chunk(conn, name, policy_id, rows[start : start + _CHUNK], out)
    return out


def _chunk(
    conn: Connection, name: str, policy_id: str, rows: Sequence[BaselineRow], out: BaselineWrites
) -> None:
    keys = list({(r.tenant_id, r.post_id) for r in rows})
    text_of = {
        (str(t), str(p)): str(h)
        for t, p, h in conn.execute(
            sa.select(posts.c.tenant_id, posts.c.post_id, posts.c.content_hash).where(
                sa.tuple_(posts.c.tenant_id, posts.c.post_id).in_(keys)
            )
        )
    }
    b = baselines
    held: dict[tuple[str, str], tuple[Any, ...]] = {
        (str(r.tenant_id), str(r.post_id)): (r.policy_id, r.label, r.scores, r.content_hash)
        for r in conn.execute(
            sa.select(b).where(b.c.name == name, sa.tuple_(b.c.tenant_id, b.c.post_id).in_(keys))
        )
    }
    writes: dict[tuple[str, str], dict[str, Any]] = {}
    now = utcnow()
    for row in rows:
        key = (row.tenant_id, row.post_id)
        text = text_of.get(key)
        if text is None:
            out.missing.append(row)
            continue
        value = (policy_id, row.label, row.scores, text)
        before = held.get(key)
        if before == value:
            out.unchanged += 1
            continue
        if before is None:
            out.imported += 1
        else:
            out.updated += 1
        held[key] = value
        writes[key] = {
            "name": name,
            "tenant_id": row.tenant_id,
            "post_id": row.post_id,
            "policy_id": policy_id,
            "label": row.label,
            "scores": row.scores,
            "content_hash": text,
            "imported_at": now,
        }
    if writes:
        stmt = insert_for(conn, b)
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=["name", "tenant_id", "post_id"],
                set_={
                    c: stmt.excluded[c]
                    for c in ("policy_id", "label", "scores", "content_hash", "imported_at")
                },
            ),
            list(writes.values()),
        )


def baseline_names(conn: Connection) -> list[str]:
    """The names of the baselines in the store."""
    found = conn.execute(sa.select(baselines.c.name).distinct().order_by(baselines.c.name))
    return [str(n) for n in found.scalars()]


def _paired(name: str, policy_id: str) -> Any:
    """Posts with a baseline of ``name`` and a label in force under ``policy_id``, both for
    the post's current text."""
    b, al, p = baselines, applied_labels, posts
    return (
        sa.select()
        .select_from(b)
        .join(p, sa.and_(p.c.tenant_id == b.c.tenant_id, p.c.post_id == b.c.post_id))
        .join(
            al,
            sa.and_(
                al.c.tenant_id == b.c.tenant_id,
                al.c.post_id == b.c.post_id,
                al.c.policy_id == b.c.policy_id,
            ),
        )
        .where(
            b.c.name == name,
            b.c.policy_id == policy_id,
            b.c.content_hash == p.c.content_hash,
            al.c.content_hash == p.c.content_hash,
        )
    )


def baseline_tenants(conn: Connection, name: str) -> list[str]:
    """The tenants ``name`` holds posts of."""
    b = baselines
    found = conn.execute(
        sa.select(b.c.tenant_id).where(b.c.name == name).distinct().order_by(b.c.tenant_id)
    )
    return [str(t) for t in found.scalars()]


def transition_counts(
    conn: Connection, name: str, policy_id: str, tenants: Sequence[str]
) -> list[tuple[str, str, str, int]]:
    """(tenant, old label, new label, posts) over the posts of ``tenants`` that have both."""
    b, al = baselines, applied_labels
    n = sa.func.count().label("n")
    stmt = (
        _paired(name, policy_id)
        .add_columns(b.c.tenant_id, b.c.label, al.c.label, n)
        .where(b.c.tenant_id.in_(list(tenants)))
        .group_by(b.c.tenant_id, b.c.label, al.c.label)
        .order_by(b.c.tenant_id, b.c.label, al.c.label)
    )
    return [(str(t), str(old), str(new), int(c)) for t, old, new, c in conn.execute(stmt)]


def moved_posts(
    conn: Connection,
    name: str,
    policy_id: str,
    tenant: str,
    old_labels: Sequence[str],
    new_labels: Sequence[str],
    limit: int | None = None,
) -> Iterator[tuple[str, str, str, str]]:
    """(post id, old label, new label, text) of ``tenant``'s posts whose baseline label is one
    of ``old_labels`` and label in force one of ``new_labels``, in post order (the first
    ``limit``)."""
    b, al, p = baselines, applied_labels, posts
    stmt = (
        _paired(name, policy_id)
        .add_columns(b.c.post_id, b.c.label, al.c.label, p.c.text)
        .where(
            b.c.tenant_id == tenant,
            b.c.label.in_(list(old_labels)),
            al.c.label.in_(list(new_labels)),
        )
        .order_by(b.c.post_id)
        .limit(limit)
    )
    for post_id, old, new, text in conn.execution_options(yield_per=1000).execute(stmt):
        yield str(post_id), str(old), str(new), str(text)


def against_baseline(
    conn: Connection, name: str, policy: Policy, tenants: Sequence[str], listed: int
) -> list[dict[str, Any]]:
    """Per tenant of ``tenants``: the posts with both labels, agreement and Cohen's kappa with
    their 95% intervals (``domain/policy/agreement.py``, as for decisions), the transitions
    (old label -> new label -> posts), and the posts the new labels act on that the old
    passed (``now_flagged``) and the reverse (``now_passed``), the first ``listed`` of each
    by post id."""
    counts: dict[str, dict[tuple[str, str], int]] = {t: {} for t in tenants}
    for tenant, old, new, n in transition_counts(conn, name, policy.policy_id, tenants):
        counts[tenant][(old, new)] = n
    out = []
    for tenant in tenants:
        pairs = counts[tenant]
        labels = sorted({x for pair in pairs for x in pair})
        passes, acts = acting(policy, labels)
        posts, agreed = sum(pairs.values()), sum(n for (o, w), n in pairs.items() if o == w)
        kappa = cohen_kappa(pairs)
        transitions: dict[str, dict[str, int]] = {}
        for (old, new), n in sorted(pairs.items()):
            transitions.setdefault(old, {})[new] = n
        doc: dict[str, Any] = {
            "tenant": tenant,
            "posts": posts,
            "agreement": agreed / posts if posts else None,
            "agreement_ci95": list(ci) if (ci := wilson(agreed, posts)) else None,
            "kappa": kappa.value,
            "kappa_ci95": list(kappa.ci) if kappa.ci else None,
            "transitions": transitions,
        }
        for key, olds, news in (("now_flagged", passes, acts), ("now_passed", acts, passes)):
            moved = sum(n for (o, w), n in pairs.items() if o in olds and w in news)
            found = moved_posts(conn, name, policy.policy_id, tenant, olds, news, listed)
            ids = [post_id for post_id, _old, _new, _text in found]
            doc[key] = {"posts": moved, "old_labels": olds, "new_labels": news, "post_ids": ids}
        out.append(doc)
    return out
