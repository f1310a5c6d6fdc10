"""Keyed upsert of accepted labels: ``applied_labels`` per (tenant, post, policy id), and the
posts' label columns (set-based, idempotent).

A policy's versions stand side by side in ``results``; the label in force for a post is the
newest version's. The apply of a version writes only where no newer version of the same policy
already holds the post, so an older version's label never replaces a newer one's, whatever
order the runs finish in: the versions are ranked from ``policy_versions`` inside the apply's
transaction, under a lock per (tenant, policy id) that concurrent applies of that policy share
(SQLite's write lock, a PostgreSQL transaction advisory lock).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.work.keys import Versions
from backfill_assets.ledger.decisions.precedence import IS_HUMAN, decided_in_force, replaceable
from backfill_assets.ledger.dialect import insert_for
from backfill_assets.ledger.engine import is_sqlite
from backfill_assets.ledger.policies import register, versions_of
from backfill_assets.ledger.run.partition_groups import claimed_by
from backfill_assets.ledger.tables import MODEL, applied_labels, posts, results, utcnow


@dataclass(frozen=True)
class ApplyReport:
    """What one partition's apply did."""

    eligible: int
    changed: int
    # Eligible posts whose label in force is a newer version's, left as they are.
    newer_kept: int
    # Eligible posts whose label in force is a moderator's decision, left as they are.
    human_kept: int
    target: str
    code_version: str
    policy_version: str

    @property
    def unchanged(self) -> int:
        """Eligible posts that already carried this label and version."""
        return self.eligible - self.changed - self.newer_kept - self.human_kept


def _accepted(
    owners: Mapping[tuple[str, int], object], versions: Versions
) -> sa.ColumnElement[bool]:
    # Only a result for the post's *current* text under these versions is applied: a label of
    # an edited post's older text must not land on the new text.
    return sa.and_(
        claimed_by(results, owners),
        results.c.task_version == versions.task_version,
        results.c.key_version == versions.key_version,
        results.c.model == versions.model,
        posts.c.tenant_id == results.c.tenant_id,
        posts.c.post_id == results.c.post_id,
        posts.c.content_hash == results.c.content_hash,
        posts.c.slice == results.c.slice,
    )


def _lock(conn: Connection, tenant_ids: Sequence[str], policy_id: str) -> None:
    """Serialise applies of one policy for each of ``tenant_ids`` (SQLite: the write
    transaction is). One statement takes them in the order given (a function scan yields
    the array in order): one a tenant was a round trip each, 10,000 for small tenants."""
    if is_sqlite(conn.engine) or not tenant_ids:
        return
    keys = [
        int.from_bytes(
            hashlib.sha256(f"apply|{t}|{policy_id}".encode()).digest()[:8], "big", signed=True
        )
        for t in tenant_ids
    ]
    conn.execute(
        sa.text("SELECT pg_advisory_xact_lock(k) FROM unnest(CAST(:keys AS bigint[])) AS k"),
        {"keys": keys},
    )


def newer_versions(conn: Connection, policy: Policy) -> list[str]:
    """Key versions of the same policy id that outrank ``policy`` (registered first)."""
    ranked = versions_of(conn, policy.policy_id)
    mine = [i for i, v in enumerate(ranked) if v.key_version == policy.key_version]
    return [v.key_version for v in ranked[mine[0] + 1 :]] if mine else []


@dataclass(frozen=True)
class _Held:
    """What an apply of one version leaves alone: rows of newer versions (their key
    versions), and moderators' decisions other than those it may replace (``replaceable``:
    label, rule ids and policy version of decisions this version no longer has)."""

    newer: list[str]
    replaceable: list[tuple[str, str, str]]

    def kept(self, al: sa.Table, excluded: Any) -> sa.ColumnElement[bool]:
        """Rows the upsert may overwrite: a model's, not a newer version's, or a decision
        that is replaceable or about an older text of the post."""
        human_open = [al.c.content_hash != excluded.content_hash]
        if self.replaceable:
            triple = sa.tuple_(al.c.label, al.c.rule_ids, al.c.policy_version)
            human_open.append(triple.in_(self.replaceable))
        writable = sa.or_(al.c.source == MODEL, *human_open)
        if self.newer:
            return sa.and_(writable, al.c.key_version.not_in(self.newer))
        return writable


def _upsert(
    conn: Connection,
    match: sa.ColumnElement[bool],
    policy: Policy,
    held: _Held,
    *returning: sa.ColumnElement[Any],
) -> sa.CursorResult[*tuple[Any, ...]]:
    """Write this version's labels into ``applied_labels``. Its row count, or the rows it
    ``returning``, are the rows written: inserted or changed (an upsert whose WHERE refuses
    the update counts and returns nothing)."""
    al = applied_labels
    source = sa.select(
        results.c.tenant_id,
        results.c.post_id,
        sa.literal(policy.policy_id),
        results.c.label,
        results.c.rule_ids,
        sa.literal(policy.version),
        results.c.key_version,
        results.c.model,
        results.c.key,
        results.c.content_hash,
        sa.literal(utcnow(), sa.DateTime),
        sa.literal(MODEL),
    ).where(match)
    columns = [
        "tenant_id",
        "post_id",
        "policy_id",
        "label",
        "rule_ids",
        "policy_version",
        "key_version",
        "model",
        "result_key",
        "content_hash",
        "applied_at",
        "source",
    ]
    stmt = insert_for(conn, al).from_select(columns, source)
    excluded = stmt.excluded
    replace = [
        "label",
        "rule_ids",
        "policy_version",
        "key_version",
        "model",
        "result_key",
        "content_hash",
    ]
    differs = sa.or_(*(al.c[c].is_distinct_from(excluded[c]) for c in [*replace, "source"]))
    stmt = stmt.on_conflict_do_update(
        index_elements=[al.c.tenant_id, al.c.post_id, al.c.policy_id],
        set_={
            **{c: excluded[c] for c in replace},
            "applied_at": excluded.applied_at,
            "source": excluded.source,
        },
        where=sa.and_(differs, held.kept(al, excluded)),
    )
    return conn.execute(stmt.returning(*returning) if returning else stmt)


def apply_partitions(
    conn: Connection,
    parts: Sequence[tuple[str, Sequence[int]]],
    versions: Versions,
    policy: Policy,
    live: bool = False,
) -> list[ApplyReport]:
    """Write accepted labels of each partition (tenant, its stored slices) under ``policy``,
    in the caller's one transaction and one statement per step for them all; rows already up
    to date are not touched, and posts a newer version of the policy holds are left to it.

    Keyed by (tenant, post_id, policy id): replaying changes nothing, not even a timestamp,
    so ``applied_labels`` and the posts table stay byte-identical.
    """
    if versions.key_version != policy.key_version:
        raise ValueError("the versions name another policy than the one applied")
    # In one order, so two transactions over overlapping tenants never wait on each other.
    tenants = sorted({t for t, _s in parts})
    _lock(conn, tenants, policy.policy_id)
    register(conn, policy)
    newer = newer_versions(conn, policy)
    decided = decided_in_force(conn, policy.policy_id, tenants)
    held = _Held(newer, replaceable(policy, decided))
    owners = {(t, s): i for i, (t, slices) in enumerate(parts) for s in slices}
    eligible, changed = [0] * len(parts), [0] * len(parts)
    newer_kept, human_kept = [0] * len(parts), [0] * len(parts)
    if owners:
        match = _accepted(owners, versions)
        for i, n in _per_part(conn, posts, match, owners).items():
            eligible[i] = n
        for i, n in _written(conn, match, policy, held, parts, owners).items():
            changed[i] = n
        al = applied_labels
        in_force = sa.and_(
            al.c.tenant_id == posts.c.tenant_id,
            al.c.post_id == posts.c.post_id,
            al.c.policy_id == policy.policy_id,
        )
        if newer:
            by_newer = sa.and_(in_force, al.c.key_version.in_(newer))
            for i, n in _per_part(conn, posts, sa.and_(match, by_newer), owners).items():
                newer_kept[i] = n
        if decided:
            by_human = sa.and_(in_force, IS_HUMAN)
            if newer:
                by_human = sa.and_(by_human, al.c.key_version.not_in(newer))
            for i, n in _per_part(conn, posts, sa.and_(match, by_human), owners).items():
                human_kept[i] = n
        _posts_columns(conn, match, versions, policy, live)
    return [
        ApplyReport(
            eligible=eligible[i],
            changed=changed[i],
            newer_kept=newer_kept[i],
            human_kept=human_kept[i],
            target="live+shadow" if live else "shadow",
            code_version=versions.code_version,
            policy_version=policy.version,
        )
        for i in range(len(parts))
    ]


def _per_part(
    conn: Connection, table: sa.Table, where: sa.ColumnElement[bool], owners: Mapping[Any, int]
) -> dict[int, int]:
    """Rows of ``table`` matching ``where``, counted per partition (grouped in SQL)."""
    stmt = (
        sa.select(table.c.tenant_id, table.c.slice, sa.func.count())
        .where(where)
        .group_by(table.c.tenant_id, table.c.slice)
    )
    out: dict[int, int] = {}
    for tenant, slice_no, n in conn.execute(stmt):
        part = owners.get((str(tenant), int(slice_no)))
        if part is not None:
            out[part] = out.get(part, 0) + int(n)
    return out


def _written(
    conn: Connection,
    match: sa.ColumnElement[bool],
    policy: Policy,
    held: _Held,
    parts: Sequence[tuple[str, Sequence[int]]],
    owners: Mapping[Any, int],
) -> dict[int, int]:
    """Upsert the labels; the rows written per partition. One partition: the statement's row
    count. One partition per tenant: the tenants the upsert returns. Otherwise each written
    post is placed by its slice (read only then: a big tenant's partitions are alone in
    their group, so that read is of small ones)."""
    tenants = [t for t, _s in parts]
    if len(parts) == 1:
        return {0: int(_upsert(conn, match, policy, held).rowcount or 0)}
    al = applied_labels
    if len(set(tenants)) == len(tenants):
        part_of = {t: i for i, t in enumerate(tenants)}
        out: dict[int, int] = {}
        for row in _upsert(conn, match, policy, held, al.c.tenant_id):
            part = part_of[str(row[0])]
            out[part] = out.get(part, 0) + 1
        return out
    placed = {
        (str(t), str(p)): owners[(str(t), int(s))]
        for t, p, s in conn.execute(
            sa.select(posts.c.tenant_id, posts.c.post_id, posts.c.slice).where(match)
        )
    }
    out = {}
    for row in _upsert(conn, match, policy, held, al.c.tenant_id, al.c.post_id):
        part = placed[(str(row[0]), str(row[1]))]
        out[part] = out.get(part, 0) + 1
    return out


def _posts_columns(
    conn: Connection,
    match: sa.ColumnElement[bool],
    versions: Versions,
    policy: Policy,
    live: bool,
) -> None:
    """The posts' label columns follow the label in force: only where this version holds the
    post in ``applied_labels`` (a newer version's label is never overwritten there either)."""
    # The version written next to each label on the posts: task, policy and model.
    version = versions.code_version
    al = applied_labels
    targets = [(posts.c.moderation_label_shadow, posts.c.moderation_rubric_version_shadow)]
    if live:
        targets.append((posts.c.moderation_label, posts.c.moderation_rubric_version))
    differs = sa.or_(
        *(
            cond
            for label_col, version_col in targets
            for cond in (
                label_col.is_distinct_from(results.c.label),
                version_col.is_distinct_from(version),
            )
        )
    )
    in_force = sa.and_(
        al.c.tenant_id == posts.c.tenant_id,
        al.c.post_id == posts.c.post_id,
        al.c.policy_id == policy.policy_id,
        al.c.result_key == results.c.key,
    )
    values: dict[str, object] = {}
    for label_col, version_col in targets:
        values[label_col.name] = results.c.label
        values[version_col.name] = version
    conn.execute(posts.update().where(match, in_force, differs).values(values))
