"""Streaming import of post exports into ``posts`` (and ``tenants``, ``rejected_records``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from backfill_assets.domain.work.keys import MAX_LEVEL, level_for
from backfill_assets.domain.work.records import Post, Rejection, RowCounts
from backfill_assets.ledger.bulk import db_time, insert_rows, select_rows
from backfill_assets.ledger.dialect import insert_for
from backfill_assets.ledger.engine import is_sqlite, write_tx
from backfill_assets.ledger.run.rejects import record_rejects
from backfill_assets.ledger.run.tenants import claim_regions, tenant_regions
from backfill_assets.ledger.tables import posts, tenants, utcnow


@dataclass
class ImportSummary(RowCounts):
    """Counts printed by ``backfill-moderation import``."""

    new_tenants: list[str] = field(default_factory=list)
    # Rejected lines not recorded by an earlier import of the same file (not in the JSON).
    new_rejects: int = 0
    # Tenants with lines in this import: their slice levels are raised at the end (not JSON).
    tenants_seen: set[str] = field(default_factory=set)
    # The line (or row) last read, for a message about what stopped the import (not JSON).
    last_line: int = 0

    def add(self, other: ImportSummary) -> None:
        """Add another file's counts (a directory import)."""
        self.add_counts(other)
        self.new_rejects += other.new_rejects
        self.new_tenants += [t for t in other.new_tenants if t not in self.new_tenants]
        self.tenants_seen |= other.tenants_seen

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly form."""
        return {**self.counts(), "new_tenants": sorted(self.new_tenants)}


def register_tenants(conn: Connection, tenant_ids: Iterable[str]) -> list[str]:
    """Insert unknown tenants; returns the ones that were new."""
    wanted = sorted(set(tenant_ids))
    if not wanted:
        return []
    known = set(
        conn.execute(sa.select(tenants.c.tenant_id).where(tenants.c.tenant_id.in_(wanted)))
        .scalars()
        .all()
    )
    new = [t for t in wanted if t not in known]
    if new:
        stmt = insert_for(conn, tenants).on_conflict_do_nothing()
        now = utcnow()
        conn.execute(
            stmt,
            [
                # A new tenant starts in one partition; the import raises its level as it grows.
                {"tenant_id": t, "billed_tokens": 0, "created_at": now, "slice_level": 0}
                for t in new
            ],
        )
    return new


def raise_slice_levels(engine: Engine, tenant_ids: Iterable[str], target: int) -> dict[str, int]:
    """Raise the tenants' slice levels to what their post counts need (never lower them).

    Returns the tenants whose level rose, with the new level.
    """
    wanted = sorted(set(tenant_ids))
    raised: dict[str, int] = {}
    if not wanted:
        return raised
    with write_tx(engine) as conn:
        rows = conn.execute(
            sa.select(tenants.c.tenant_id, tenants.c.slice_level, sa.func.count(posts.c.post_id))
            .select_from(tenants.join(posts, posts.c.tenant_id == tenants.c.tenant_id))
            .where(tenants.c.tenant_id.in_(wanted), tenants.c.slice_level.is_not(None))
            .group_by(tenants.c.tenant_id, tenants.c.slice_level)
        ).all()
        for tenant_id, level, n in rows:
            needed = level_for(int(n), target)
            if needed > int(level):
                raised[str(tenant_id)] = needed
        for tenant_id, level in raised.items():
            conn.execute(
                tenants.update().where(tenants.c.tenant_id == tenant_id).values(slice_level=level)
            )
    return raised


def slice_levels(conn: Connection, tenant_ids: Iterable[str] | None) -> dict[str, int]:
    """Each tenant's slice level, of ``tenant_ids`` or (None) every tenant; tenants imported
    before levels existed use all slices."""
    stmt = sa.select(tenants.c.tenant_id, tenants.c.slice_level)
    if tenant_ids is not None:
        wanted = sorted(set(tenant_ids))
        if not wanted:
            return {}
        stmt = stmt.where(tenants.c.tenant_id.in_(wanted))
    rows = select_rows(conn, stmt)
    return {str(t): MAX_LEVEL if lvl is None else int(lvl) for t, lvl in rows}


def write_batch(
    engine: Engine,
    source: str,
    batch: list[Post | Rejection],
    summary: ImportSummary,
    hook: Callable[[Connection, list[Post | Rejection]], None] | None = None,
    gold: bool = False,
) -> None:
    """Upsert one batch of parsed lines in one transaction; ``hook`` runs inside it last.

    ``gold``: the posts of a gold set (``evaluate``), whose tenant must hold gold sets; an
    import's lines for such a tenant are rejected, so gold and customer posts never mix.
    """
    latest: dict[tuple[str, str], Post] = {}
    rejects: list[Rejection] = []
    with write_tx(engine) as conn:
        checked, claimed = _check_regions(conn, _check_purpose(conn, batch, gold))
        for item in checked:
            if isinstance(item, Rejection):
                rejects.append(item)
                continue
            ident = (item.tenant_id, item.post_id)
            prior = latest.get(ident)
            if prior is not None:
                # Same post twice in one batch: the later line wins, like a later export would.
                if prior.content_hash == item.content_hash:
                    summary.unchanged += 1
                else:
                    summary.updated += 1
            latest[ident] = item
        summary.tenants_seen.update(t for t, _ in latest)
        summary.new_tenants += register_tenants(conn, (t for t, _ in latest))
        claim_regions(conn, claimed)
        _upsert_posts(conn, list(latest.values()), summary)
        summary.new_rejects += record_rejects(conn, source, rejects)
        if hook is not None:
            hook(conn, batch)
    summary.rejected += sum(r.rows for r in rejects)


def _check_purpose(
    conn: Connection, batch: list[Post | Rejection], gold: bool
) -> list[Post | Rejection]:
    """Lines whose tenant is not of the kind this write is for, turned into rejections."""
    named = sorted({p.tenant_id for p in batch if isinstance(p, Post)})
    if not named:
        return batch
    purpose = dict(
        conn.execute(
            sa.select(tenants.c.tenant_id, tenants.c.purpose).where(tenants.c.tenant_id.in_(named))
        ).all()
    )
    out: list[Post | Rejection] = []
    for item in batch:
        if isinstance(item, Post) and (purpose.get(item.tenant_id) is not None) != gold:
            why = (
                "the tenant is not one that holds gold sets"
                if gold
                else f"tenant {item.tenant_id} holds gold sets (evaluate), not posts to moderate"
            )
            out.append(Rejection(item.line, why, item.tenant_id))
            continue
        out.append(item)
    return out


def _check_regions(
    conn: Connection, batch: list[Post | Rejection]
) -> tuple[list[Post | Rejection], dict[str, str]]:
    """Lines in order, those naming a region other than their tenant's turned into rejections;
    and the regions to set for tenants that have none yet.

    The first region a tenant gets (stored, or from its first line that names one) stays:
    a later line that names another is rejected with its line number, across files and
    imports alike. Moving a tenant is ``tenant set-region``, never a side effect of an export.
    """
    named = {p.tenant_id for p in batch if isinstance(p, Post) and p.region is not None}
    current = tenant_regions(conn, named)
    claimed: dict[str, str] = {}
    out: list[Post | Rejection] = []
    for item in batch:
        if isinstance(item, Post) and item.region is not None:
            have = current.get(item.tenant_id) or claimed.get(item.tenant_id)
            if have is None:
                claimed[item.tenant_id] = item.region
            elif have != item.region:
                reason = (
                    f"region {item.region!r} conflicts with tenant {item.tenant_id}'s region "
                    f"{have!r} (`backfill-moderation tenant set-region` moves a tenant)"
                )
                out.append(Rejection(item.line, reason, item.tenant_id))
                continue
        out.append(item)
    return out, claimed


_POST_COLUMNS = (
    "tenant_id",
    "post_id",
    "text",
    "content_hash",
    "slice",
    "imported_at",
    "updated_at",
)


# Pairs per probe on SQLite: two bind parameters each, well under its 32,766.
_PROBE_PAIRS = 2000


def _stored_hashes(conn: Connection, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """The stored content hash of each (tenant_id, post_id) that exists, in one primary-key
    probe per batch on the driver.

    A batch of a many-tenant export holds a few posts of each of hundreds of tenants: one query
    per tenant (with SQLAlchemy building an IN list each time) was most of an import's time.
    """
    raw = conn.connection.driver_connection
    if raw is None:
        raise RuntimeError("connection is closed")
    cursor = raw.cursor()
    found: dict[tuple[str, str], str] = {}
    try:
        if is_sqlite(conn.engine):
            for i in range(0, len(pairs), _PROBE_PAIRS):
                chunk = pairs[i : i + _PROBE_PAIRS]
                values = ", ".join("(?, ?)" for _ in chunk)
                cursor.execute(
                    "SELECT tenant_id, post_id, content_hash FROM posts"
                    f" WHERE (tenant_id, post_id) IN (VALUES {values})",
                    [v for pair in chunk for v in pair],
                )
                found.update({(t, p): h for t, p, h in cursor.fetchall()})
        else:
            cursor.execute(
                "SELECT p.tenant_id, p.post_id, p.content_hash FROM posts p"
                " JOIN unnest(%s::text[], %s::text[]) AS b (tenant_id, post_id)"
                " ON p.tenant_id = b.tenant_id AND p.post_id = b.post_id",
                ([t for t, _ in pairs], [p for _, p in pairs]),
            )
            found.update({(t, p): h for t, p, h in cursor.fetchall()})
    finally:
        cursor.close()
    return found


def _upsert_posts(conn: Connection, batch: list[Post], summary: ImportSummary) -> None:
    if not batch:
        return
    existing = _stored_hashes(conn, [(p.tenant_id, p.post_id) for p in batch])
    now = utcnow()
    stamp = db_time(conn.engine.dialect.name, now)  # what the driver-level insert binds
    inserts, updates = [], []
    for p in batch:
        old = existing.get((p.tenant_id, p.post_id))
        row = {
            "tenant_id": p.tenant_id,
            "post_id": p.post_id,
            "text": p.text,
            "content_hash": p.content_hash,
            "slice": p.slice,
            "imported_at": stamp,
            "updated_at": stamp,
        }
        if old is None:
            inserts.append(row)
        elif old != p.content_hash:
            updates.append(row)
        else:
            summary.unchanged += 1
    if inserts:
        # Straight to the driver (COPY on PostgreSQL): SQLAlchemy's per-row parameter
        # handling was most of an import's time.
        insert_rows(conn, posts, _POST_COLUMNS, inserts)
        summary.imported += len(inserts)
    if updates:
        conn.execute(
            posts.update()
            .where(
                posts.c.tenant_id == sa.bindparam("b_tenant"),
                posts.c.post_id == sa.bindparam("b_post"),
            )
            .values(
                text=sa.bindparam("b_text"),
                content_hash=sa.bindparam("b_hash"),
                updated_at=sa.bindparam("b_at"),
            ),
            [
                {
                    "b_tenant": r["tenant_id"],
                    "b_post": r["post_id"],
                    "b_text": r["text"],
                    "b_hash": r["content_hash"],
                    "b_at": now,
                }
                for r in updates
            ],
        )
        summary.updated += len(updates)


def content_hashes(conn: Connection, tenant_id: str) -> dict[str, str]:
    """``{post_id: content hash}`` of a tenant's posts (no text)."""
    stmt = sa.select(posts.c.post_id, posts.c.content_hash).where(posts.c.tenant_id == tenant_id)
    return {str(p): str(h) for p, h in conn.execute(stmt)}
