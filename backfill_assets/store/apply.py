"""Keyed upsert of accepted labels onto the posts' label columns (set-based, idempotent)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.core.keys import Versions
from backfill_assets.core.rubric import LABELS
from backfill_assets.store.tables import posts, results


@dataclass(frozen=True)
class ApplyReport:
    """What one partition's apply did."""

    eligible: int
    changed: int
    target: str
    rubric_version: str

    @property
    def unchanged(self) -> int:
        """Eligible posts that already carried this label and version."""
        return self.eligible - self.changed


def rubric_version(versions: Versions) -> str:
    """The version written next to each label: task, prompt and model."""
    return versions.code_version


def _accepted(tenant_id: str, slices: Sequence[int], versions: Versions) -> sa.ColumnElement[bool]:
    # Only a result for the post's *current* text under the current versions is applied: a
    # label of an edited post's older text must not land on the new text.
    return sa.and_(
        results.c.tenant_id == tenant_id,
        results.c.slice.in_(list(slices)),
        results.c.task_version == versions.task_version,
        results.c.prompt_version == versions.prompt_version,
        results.c.model == versions.model,
        results.c.label.in_(LABELS),
        posts.c.tenant_id == results.c.tenant_id,
        posts.c.post_id == results.c.post_id,
        posts.c.content_hash == results.c.content_hash,
        posts.c.slice == results.c.slice,
    )


def apply_partition(
    conn: Connection,
    tenant_id: str,
    slices: Sequence[int],
    versions: Versions,
    live: bool = False,
) -> ApplyReport:
    """Write accepted labels of one partition; rows already up to date are not touched.

    Keyed by (tenant, post_id, rubric version): replaying changes nothing, not even a timestamp,
    so the posts table stays byte-identical.
    """
    version = rubric_version(versions)
    match = _accepted(tenant_id, slices, versions)
    eligible = int(
        conn.execute(sa.select(sa.func.count()).select_from(posts).where(match)).one()[0]
    )
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
    values: dict[str, object] = {}
    for label_col, version_col in targets:
        values[label_col.name] = results.c.label
        values[version_col.name] = version
    stmt = posts.update().where(match, differs).values(values)
    changed = conn.execute(stmt).rowcount
    return ApplyReport(
        eligible=eligible,
        changed=int(changed or 0),
        target="live+shadow" if live else "shadow",
        rubric_version=version,
    )
