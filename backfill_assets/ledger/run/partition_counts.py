"""Per-partition counts for a whole run in three grouped queries (not four per partition)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.domain.work.keys import Versions
from backfill_assets.ledger.bulk import select_rows
from backfill_assets.ledger.tables import dead_letters, posts, results


@dataclass
class PartitionCounts:
    """Accepted labels, their rules and dead letters of one partition (current versions)."""

    labels: dict[str, int] = field(default_factory=dict)
    # Accepted results per rule id (from the stored comma-joined ids).
    rules: dict[str, int] = field(default_factory=dict)
    dead: dict[str, int] = field(default_factory=dict)


def _same_versions(table: sa.Table, versions: Versions) -> sa.ColumnElement[bool]:
    return sa.and_(
        table.c.model == versions.model,
        table.c.key_version == versions.key_version,
        table.c.task_version == versions.task_version,
    )


def post_counts(conn: Connection, tenants: Sequence[str]) -> dict[tuple[str, int], int]:
    """Posts per (tenant, slice)."""
    stmt = (
        sa.select(posts.c.tenant_id, posts.c.slice, sa.func.count())
        .where(posts.c.tenant_id.in_(list(tenants)))
        .group_by(posts.c.tenant_id, posts.c.slice)
    )
    return {(str(t), int(s)): int(n) for t, s, n in select_rows(conn, stmt)}


def held_posts(sizes: Mapping[tuple[str, int], int], tenant_id: str, slices: Iterable[int]) -> int:
    """Posts a partition holds: its tenant's posts in its stored slices (``sizes`` from
    ``post_counts``)."""
    return sum(sizes.get((tenant_id, s), 0) for s in slices)


def partition_counts(
    conn: Connection, tenants: Sequence[str], versions: Versions
) -> dict[tuple[str, int], PartitionCounts]:
    """Counts for every partition of ``tenants`` that has results or dead letters (its posts
    are ``post_counts``, read once where they are needed)."""
    out: dict[tuple[str, int], PartitionCounts] = defaultdict(PartitionCounts)
    wanted = list(tenants)
    for table, column, attr in (
        (results, results.c.label, "labels"),
        (dead_letters, dead_letters.c.outcome, "dead"),
    ):
        stmt = (
            sa.select(table.c.tenant_id, table.c.slice, column, sa.func.count())
            .where(table.c.tenant_id.in_(wanted), _same_versions(table, versions))
            .group_by(table.c.tenant_id, table.c.slice, column)
        )
        for t, s, value, n in conn.execute(stmt):
            getattr(out[(str(t), int(s))], attr)[str(value)] = int(n)
    stmt = (
        sa.select(results.c.tenant_id, results.c.slice, results.c.rule_ids, sa.func.count())
        .where(
            results.c.tenant_id.in_(wanted),
            _same_versions(results, versions),
            results.c.rule_ids != "",
        )
        .group_by(results.c.tenant_id, results.c.slice, results.c.rule_ids)
    )
    for t, s, joined, n in conn.execute(stmt):
        rules = out[(str(t), int(s))].rules
        for rule in str(joined).split(","):
            rules[rule] = rules.get(rule, 0) + int(n)
    return dict(out)
