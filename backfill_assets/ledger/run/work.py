"""What is left to do in a partition (who may do it: ``locks/writer_locks.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.domain.work.keys import Versions
from backfill_assets.ledger.bulk import select_rows
from backfill_assets.ledger.run.partition_groups import Owners, claimed_by, owners_of
from backfill_assets.ledger.run.submissions import OPEN_STATES
from backfill_assets.ledger.tables import (
    batch_lines,
    batch_submissions,
    dead_letters,
    posts,
    results,
)
from backfill_assets.ledger.tables import tenants as tenant_table

# Outcomes a later run must not send again without an operator's requeue or a version change.
FINAL_DEAD_OUTCOMES = ("schema_rejected", "transport_rejected")


@dataclass(frozen=True, slots=True)
class PendingPost:
    """A post of the partition with no accepted result and no final dead letter."""

    post_id: str
    content_hash: str
    text: str
    had_dead_letter: bool = False
    slice: int = 0  # the post's stored slice (keys.slice_of), not the partition's number


def _same_work(table: sa.Table, versions: Versions) -> sa.ColumnElement[bool]:
    return sa.and_(
        table.c.tenant_id == posts.c.tenant_id,
        table.c.slice == posts.c.slice,
        table.c.post_id == posts.c.post_id,
        table.c.content_hash == posts.c.content_hash,
        table.c.model == versions.model,
        table.c.key_version == versions.key_version,
        table.c.task_version == versions.task_version,
    )


def _open_chunk(versions: Versions) -> list[sa.ColumnElement[bool]]:
    """A batch chunk under ``versions`` that may still be answered (and billed) by its batch."""
    return [
        batch_submissions.c.state.in_(OPEN_STATES),
        batch_submissions.c.model == versions.model,
        batch_submissions.c.key_version == versions.key_version,
        batch_submissions.c.task_version == versions.task_version,
    ]


def _in_open_batch(versions: Versions) -> sa.Exists:
    """The post's key is a line of an open chunk (``_open_chunk``)."""
    return sa.exists().where(
        batch_lines.c.tenant_id == posts.c.tenant_id,
        batch_lines.c.post_id == posts.c.post_id,
        batch_lines.c.content_hash == posts.c.content_hash,
        batch_submissions.c.chunk_id == batch_lines.c.chunk_id,
        *_open_chunk(versions),
    )


def _unfinished(versions: Versions) -> list[sa.ColumnElement[bool]]:
    """The post has no accepted result and no final dead letter under ``versions``."""
    done = sa.exists().where(_same_work(results, versions))
    dead = sa.exists().where(
        _same_work(dead_letters, versions), dead_letters.c.outcome.in_(FINAL_DEAD_OUTCOMES)
    )
    return [~done, ~dead]


def _not_finished(
    tenant_id: str, slices: Sequence[int], versions: Versions
) -> list[sa.ColumnElement[bool]]:
    return [claimed_by(posts, owners_of(tenant_id, slices)), *_unfinished(versions)]


def pending_query(owners: Owners, versions: Versions) -> sa.Select[str, str, str, str, bool, int]:
    """Anti-join in SQL: posts of the partitions (their stored slices) minus accepted minus
    finally rejected, minus keys in an open batch chunk (left to their batch in either
    dispatch mode: a sync call for them would bill them twice)."""
    # Only evaluated for rows that pass the filters: tells the writer which accepted keys
    # have a (retry_exhausted) dead letter to clear, so it skips the delete for all others.
    had_dead = sa.exists().where(_same_work(dead_letters, versions)).label("had_dead_letter")
    return sa.select(
        posts.c.tenant_id,
        posts.c.post_id,
        posts.c.content_hash,
        posts.c.text,
        had_dead,
        posts.c.slice,
    ).where(claimed_by(posts, owners), *_unfinished(versions), ~_in_open_batch(versions))


def pending_counts(
    conn: Connection, tenants: Sequence[str] | None, versions: Versions
) -> dict[tuple[str, int], tuple[int, int]]:
    """(posts, pending keys) per (tenant, stored slice), for all tenants or ``tenants``, in one
    grouped query: what a run would send, without reading a single post text.

    Keys in an open batch chunk count as pending here: a run must still be planned for their
    partition, so that a batch-mode run re-attaches to the chunk and books it.
    """
    # Outer joins, not EXISTS inside the CASE: a correlated subquery there is probed once per
    # post (PostgreSQL cannot turn it into a join), while the joins let the planner hash-join
    # a whole store or probe the index for a few tenants. A post matches at most one result
    # and one dead letter of ``versions`` (both keyed by the post's work key), so the joins
    # never multiply rows. 100,000 posts on PostgreSQL: 1.57 -> 0.26 s.
    dead = sa.and_(
        _same_work(dead_letters, versions), dead_letters.c.outcome.in_(FINAL_DEAD_OUTCOMES)
    )
    joined = posts.outerjoin(results, _same_work(results, versions)).outerjoin(dead_letters, dead)
    left = sa.and_(results.c.key.is_(None), dead_letters.c.key.is_(None))
    pending = sa.func.sum(sa.case((left, 1), else_=0))
    stmt = (
        sa.select(posts.c.tenant_id, posts.c.slice, sa.func.count(), pending)
        .select_from(joined)
        .group_by(posts.c.tenant_id, posts.c.slice)
    )
    if tenants is not None:
        stmt = stmt.where(posts.c.tenant_id.in_(list(tenants)))
    else:
        # Every customer's tenant: gold sets (``evaluate``) are never part of a backfill.
        gold = sa.select(tenant_table.c.tenant_id).where(tenant_table.c.purpose.is_not(None))
        stmt = stmt.where(posts.c.tenant_id.not_in(gold))
    return {(str(t), int(s)): (int(n), int(p or 0)) for t, s, n, p in conn.execute(stmt)}


def pending_by_partition(
    conn: Connection, owners: Owners, versions: Versions
) -> dict[str, list[PendingPost]]:
    """The remaining work of each partition of ``owners`` (by partition key), in one query:
    bounded by the partitions asked for (``partition_groups.grouped``)."""
    out: dict[str, list[PendingPost]] = {key: [] for key in owners.values()}
    # One fetch of plain tuples: iterating a result row by row costs more than the query.
    for tenant_id, post_id, content_hash, text, had_dead, slice_no in select_rows(
        conn, pending_query(owners, versions)
    ):
        key = owners.get((tenant_id, slice_no))
        if key is not None:
            out[key].append(PendingPost(post_id, content_hash, text, bool(had_dead), slice_no))
    return out


def pending_posts(
    conn: Connection, tenant_id: str, slices: Sequence[int], versions: Versions
) -> list[PendingPost]:
    """One partition's remaining work (bounded by one partition)."""
    return pending_by_partition(conn, owners_of(tenant_id, slices), versions).get("", [])


def sendable_count(conn: Connection, tenants: Sequence[str], versions: Versions) -> int:
    """Keys of ``tenants`` a synchronous run would send now: what ``pending_posts`` returns,
    counted in one query without reading a post text."""
    stmt = (
        sa.select(sa.func.count())
        .select_from(posts)
        .where(
            posts.c.tenant_id.in_(list(tenants)), *_unfinished(versions), ~_in_open_batch(versions)
        )
    )
    return int(conn.execute(stmt).scalar_one())


def tenants_with_open_batches(
    conn: Connection, tenants: Sequence[str], versions: Versions
) -> set[str]:
    """Which of ``tenants`` have a batch chunk under ``versions`` that may still be answered
    (one query for a run; ``in_open_batch`` is then asked only about those tenants)."""
    stmt = (
        sa.select(batch_submissions.c.tenant_id)
        .where(batch_submissions.c.tenant_id.in_(list(tenants)), *_open_chunk(versions))
        .distinct()
    )
    return {str(t) for t in conn.execute(stmt).scalars()}


def in_open_batch(
    conn: Connection, tenant_id: str, slices: Sequence[int], versions: Versions
) -> int:
    """Keys of the partition neither done nor dead that wait for an open batch chunk."""
    stmt = (
        sa.select(sa.func.count())
        .select_from(posts)
        .where(*_not_finished(tenant_id, slices, versions), _in_open_batch(versions))
    )
    return int(conn.execute(stmt).scalar_one())
