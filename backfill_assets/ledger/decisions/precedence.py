"""Moderators' decisions outrank the model: which label ``applied_labels`` holds for a post.

The label in force for (tenant, post, policy id) is the newest decision about the post's
current text under that policy id when there is one, else the model's. The one exception is a
newer policy version: it keeps a decision whose label and rules it still has, and otherwise
its model label takes the post and the post goes back to review (``review export``), where a
decision under the new version settles it. A decision about a post's older text (the post was
edited since) is the model's again, as a result for an older text is never applied.

Two writers meet here. ``apply_decisions`` writes decisions as they are imported; the model's
apply (``labels/apply.py``) writes only over ``model`` rows and the ``human`` rows that
``replaceable_decisions`` names for the version it applies.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.domain.policy.diff import version_order
from backfill_assets.domain.policy.document import Policy
from backfill_assets.ledger.bulk import db_time, insert_rows
from backfill_assets.ledger.dialect import key_table, with_keys
from backfill_assets.ledger.policies import registered_policy
from backfill_assets.ledger.tables import HUMAN, MODEL, applied_labels, decisions, posts, utcnow

# Keys a statement reads or writes at once.
_CHUNK = 500


def decision_key(
    tenant_id: str, post_id: str, policy_id: str, reviewer_id: str, decided_at: dt.datetime
) -> str:
    """A decision's identity: who decided about which post under which policy, and when
    (UTC, microseconds). A re-import of the same decision finds its row."""
    when = decided_at.strftime("%Y-%m-%dT%H:%M:%S.%f")
    text = "\x1f".join((tenant_id, post_id, policy_id, reviewer_id, when))
    return "d-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:30]


def holds(policy: Policy, label: str, rule_ids: str) -> bool:
    """Whether ``policy`` still has a decision's label and every one of its rules."""
    rules = {rule for rule, _label in policy.rule_labels}
    return label in policy.label_ids and all(r in rules for r in rule_ids.split(",") if r)


@dataclass
class DecisionsApplied:
    """What applying decisions did to ``applied_labels``."""

    # Posts whose label in force is now a decision's (written or changed).
    applied: int = 0
    # Already holding that decision: nothing written.
    unchanged: int = 0
    # A newer policy version's model label holds the post and lacks the decision's label or a
    # rule: the decision is kept in ``decisions`` and the post waits in the review queue.
    held_for_review: int = 0
    # The post was edited after the decision was imported: the decision is not about its text.
    stale_text: int = 0


def apply_decisions(conn: Connection, keys: Iterable[tuple[str, str, str]]) -> DecisionsApplied:
    """Bring ``applied_labels`` in line with the decisions about ``keys`` (tenant, post,
    policy id), in the caller's transaction. Idempotent: a replay writes nothing."""
    out = DecisionsApplied()
    policy_of = functools.cache(lambda kv: registered_policy(conn, kv))
    unique = sorted(set(keys))
    for start in range(0, len(unique), _CHUNK):
        _apply_chunk(conn, unique[start : start + _CHUNK], policy_of, out)
    return out


def _apply_chunk(
    conn: Connection, keys: Sequence[tuple[str, str, str]], policy_of: Any, out: DecisionsApplied
) -> None:
    d, al = decisions, applied_labels
    newest: dict[tuple[str, str, str], sa.Row[Any]] = {}
    texts = sa.select(posts.c.tenant_id, posts.c.post_id, posts.c.content_hash)
    pairs = sorted({(t, p) for t, p, _ in keys})
    current_text = {
        (str(t), str(p)): str(h)
        for t, p, h in conn.execute(
            with_keys(conn, texts, [posts.c.tenant_id, posts.c.post_id], pairs)
        )
    }
    decided = with_keys(conn, sa.select(d), [d.c.tenant_id, d.c.post_id, d.c.policy_id], keys)
    for dec in conn.execute(decided):
        key = (dec.tenant_id, dec.post_id, dec.policy_id)
        seen = newest.get(key)
        if seen is None or (dec.decided_at, dec.decision_key) > (
            seen.decided_at,
            seen.decision_key,
        ):
            newest[key] = dec
    held = with_keys(conn, sa.select(al), [al.c.tenant_id, al.c.post_id, al.c.policy_id], keys)
    in_force = {(r.tenant_id, r.post_id, r.policy_id): r for r in conn.execute(held)}
    writes: list[dict[str, Any]] = []
    for key, dec in newest.items():
        if current_text.get((dec.tenant_id, dec.post_id)) != dec.content_hash:
            out.stale_text += 1
            continue
        row = in_force.get(key)
        if row is not None and row.source == HUMAN and _same(row, dec):
            out.unchanged += 1
            continue
        if row is not None and row.source == MODEL and not _outranks(dec, row, policy_of):
            out.held_for_review += 1
            continue
        writes.append(_applied_row(dec))
    if writes:
        _upsert(conn, writes)
        _posts_columns(conn, writes)
        out.applied += len(writes)


def _same(row: sa.Row[Any], dec: sa.Row[Any]) -> bool:
    """The post already holds this decision as it now reads (a re-import may have changed
    its label, rules or version under the same key)."""
    return bool(
        row.result_key == dec.decision_key
        and (row.label, row.rule_ids, row.key_version) == (dec.label, dec.rule_ids, dec.key_version)
    )


def _outranks(dec: sa.Row[Any], model_row: sa.Row[Any], policy_of: Any) -> bool:
    """A decision takes a model row of its own or an older version; a newer version's only
    when that version still has the decision's label and rules."""
    if version_order(str(dec.policy_version)) >= version_order(str(model_row.policy_version)):
        return True
    newer = policy_of(str(model_row.key_version))
    return newer is not None and holds(newer, str(dec.label), str(dec.rule_ids))


def _applied_row(dec: sa.Row[Any]) -> dict[str, Any]:
    return {
        "tenant_id": dec.tenant_id,
        "post_id": dec.post_id,
        "policy_id": dec.policy_id,
        "label": dec.label,
        "rule_ids": dec.rule_ids,
        "policy_version": dec.policy_version,
        "key_version": dec.key_version,
        "model": HUMAN,
        "result_key": dec.decision_key,
        "content_hash": dec.content_hash,
        "applied_at": utcnow(),
        "source": HUMAN,
    }


_REPLACED = ("label", "rule_ids", "policy_version", "key_version", "model", "result_key")


_UPSERT_COLUMNS = (
    "tenant_id",
    "post_id",
    "policy_id",
    *_REPLACED,
    "content_hash",
    "applied_at",
    "source",
)
_ON_KEY = "ON CONFLICT (tenant_id, post_id, policy_id) DO UPDATE SET " + ", ".join(
    f"{c} = excluded.{c}" for c in _UPSERT_COLUMNS[3:]
)


def _upsert(conn: Connection, rows: list[dict[str, Any]]) -> None:
    # Straight to the driver (COPY and one INSERT ... SELECT on PostgreSQL): SQLAlchemy's
    # per-row parameters cost more than the writes at a million decisions.
    when = db_time(conn.dialect.name, utcnow())
    insert_rows(
        conn, applied_labels, _UPSERT_COLUMNS, [r | {"applied_at": when} for r in rows], _ON_KEY
    )


def _posts_columns(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """The posts' shadow label columns follow the label in force (the live pair is the live
    moderators' own: they made the decision)."""
    values = [
        (r["tenant_id"], r["post_id"], r["label"], f"source=human;policy={r['key_version']}")
        for r in rows
    ]
    if conn.dialect.name == "postgresql":
        # One statement for the batch: an UPDATE a row would be a round trip each 100.
        w = key_table(values, 4)
        conn.execute(
            posts.update()
            .where(posts.c.tenant_id == w.c.k0, posts.c.post_id == w.c.k1)
            .values(moderation_label_shadow=w.c.k2, moderation_rubric_version_shadow=w.c.k3)
        )
        return
    conn.execute(
        posts.update()
        .where(posts.c.tenant_id == sa.bindparam("t"), posts.c.post_id == sa.bindparam("p"))
        .values(
            moderation_label_shadow=sa.bindparam("label"),
            moderation_rubric_version_shadow=sa.bindparam("version"),
        ),
        [{"t": t, "p": p, "label": lab, "version": v} for t, p, lab, v in values],
    )


# A literal, so the partial index on decisions in force (sql/025) serves the read.
IS_HUMAN = applied_labels.c.source == sa.literal_column("'human'")


def decided_in_force(
    conn: Connection, policy_id: str, tenant_ids: Sequence[str]
) -> list[tuple[str, str, str]]:
    """(label, rule ids, policy version) of the decisions in force for ``tenant_ids`` under
    ``policy_id``, as distinct triples: a few per policy, however many decisions."""
    al = applied_labels
    found = conn.execute(
        sa.select(al.c.label, al.c.rule_ids, al.c.policy_version)
        .where(IS_HUMAN, al.c.policy_id == policy_id, al.c.tenant_id.in_(list(tenant_ids)))
        .distinct()
    )
    return [(str(label), str(rules), str(version)) for label, rules, version in found]


def replaceable(
    policy: Policy, triples: Sequence[tuple[str, str, str]]
) -> list[tuple[str, str, str]]:
    """The decisions in force (``decided_in_force``) that a model apply of ``policy`` may
    replace: decided under this version or an older one, with a label or a rule this version
    no longer has."""
    mine = version_order(policy.version)
    return [
        (label, rules, version)
        for label, rules, version in triples
        if version_order(version) <= mine and not holds(policy, label, rules)
    ]
