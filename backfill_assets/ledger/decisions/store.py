"""``decisions import``'s writes: a batch of moderators' decisions checked against the store
(the policy version, its labels and rules, the post) and kept in ``decisions``, then applied
(``precedence.apply_decisions``), all in one transaction.

A decision is keyed by ``decision_key`` (who decided about which post under which policy, and
when): a re-import finds its row and changes nothing. The row keeps the post's text it was
first imported against: a decision re-imported after the post was edited is still about the
old text, so it does not take the new one (the model's again, see ``precedence``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.work.records import Rejection, RowCounts, shown
from backfill_assets.ledger.bulk import db_time, insert_rows
from backfill_assets.ledger.decisions.precedence import (
    DecisionsApplied,
    apply_decisions,
    decision_key,
)
from backfill_assets.ledger.dialect import with_keys
from backfill_assets.ledger.engine import write_tx
from backfill_assets.ledger.policies import register, registered_policy, versions_of
from backfill_assets.ledger.run.rejects import record_rejects
from backfill_assets.ledger.tables import decisions, posts, tenants, utcnow

# Called inside each batch's transaction, last, with the batch.
BatchHook = Callable[[Connection, Sequence["Decision | Rejection"]], None]

# Keys one statement reads at once.
_CHUNK = 500
# What a re-import compares: a change in any of them is an update of the decision.
_COMPARED = ("label", "rule_ids", "reason_code", "policy_version", "key_version")


@dataclass(frozen=True, slots=True)
class Decision:
    """A decision as read from a row, its fields checked (``ingest/decisions.py``); the
    store's checks (policy, labels, the post) come at the write."""

    tenant_id: str
    post_id: str
    policy_id: str
    policy_version: str
    label: str
    # Comma-joined in sorted order, '' for none (as stored).
    rule_ids: str
    reviewer_id: str
    # Naive UTC.
    decided_at: dt.datetime
    reason_code: str | None
    line: int
    locator: str | None = None


@dataclass
class DecisionsSummary(RowCounts):
    """What ``decisions import`` did: the rows read and their fate, and what applying the
    decisions did to the labels in force."""

    applied: DecisionsApplied = field(default_factory=DecisionsApplied)
    # Rejected rows not recorded by an earlier import of the same source (not in the JSON).
    new_rejects: int = 0

    def add(self, other: DecisionsSummary) -> None:
        """Add another file's counts (a directory import)."""
        self.add_counts(other)
        self.new_rejects += other.new_rejects
        _add_applied(self.applied, other.applied)

    def as_dict(self) -> dict[str, int]:
        """The ``--json`` summary: the rows' counts, then the apply's (``already_applied``:
        posts that already held the decision)."""
        applied = self.applied
        return {
            **self.counts(),
            "applied": applied.applied,
            "already_applied": applied.unchanged,
            "held_for_review": applied.held_for_review,
            "stale_text": applied.stale_text,
        }


def _add_applied(into: DecisionsApplied, more: DecisionsApplied) -> None:
    for name, value in asdict(more).items():
        setattr(into, name, getattr(into, name) + value)


@dataclass
class PolicyVersions:
    """The policy versions decisions may name: those the store registered, and the one in
    force (registered at its first decision). Read once per (policy id, version)."""

    current: Policy
    _found: dict[tuple[str, str], tuple[str, Policy] | None] = field(default_factory=dict)

    def resolve(self, conn: Connection, policy_id: str, version: str) -> tuple[str, Policy] | None:
        """The key version and policy that (``policy_id``, ``version``) names, or ``None``."""
        wanted = (policy_id, version)
        if wanted not in self._found:
            self._found[wanted] = self._lookup(conn, policy_id, version)
        return self._found[wanted]

    def _lookup(self, conn: Connection, policy_id: str, version: str) -> tuple[str, Policy] | None:
        cur = self.current
        if (cur.policy_id, cur.version) == (policy_id, version):
            register(conn, cur)
            return cur.key_version, cur
        # The same version string registered more than once (dialects, an edit without a
        # new version): its latest registration, as the apply ranks them.
        same = [v for v in versions_of(conn, policy_id) if v.version == version]
        for found in reversed(same):
            policy = registered_policy(conn, found.key_version)
            if policy is not None:
                return found.key_version, policy
        return None


def _check_policy(
    conn: Connection, d: Decision, versions: PolicyVersions
) -> tuple[str, Rejection | None]:
    """The decision's key version, or why its policy, label or rules are refused."""
    found = versions.resolve(conn, d.policy_id, d.policy_version)
    where = shown(d.policy_id), shown(d.policy_version)
    if found is None:
        why = (
            f"policy {where[0]} version {where[1]} is neither registered in the store nor "
            "the policy in force"
        )
        return "", _reject(d, why)
    key_version, policy = found
    if d.label not in policy.label_ids:
        why = f"label {shown(d.label)!r} is not a label of policy {where[0]} version {where[1]}"
        return "", _reject(d, why)
    rules = {rule for rule, _label in policy.rule_labels}
    unknown = [r for r in d.rule_ids.split(",") if r and r not in rules]
    if unknown:
        why = f"rule {shown(unknown[0])!r} is not a rule of policy {where[0]} version {where[1]}"
        return "", _reject(d, why)
    return key_version, None


def _reject(d: Decision, reason: str) -> Rejection:
    return Rejection(d.line, reason, d.tenant_id, d.locator)


def _chunks(items: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


def _posts_of(conn: Connection, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Any]:
    """(tenant, post) -> (the post's content hash, whether its tenant holds gold sets)."""
    found: dict[tuple[str, str], Any] = {}
    unique = sorted(set(pairs))
    for part in _chunks(unique):
        stmt: sa.Select[Any] = sa.select(
            posts.c.tenant_id, posts.c.post_id, posts.c.content_hash, tenants.c.purpose
        ).join(tenants, tenants.c.tenant_id == posts.c.tenant_id)
        for row in conn.execute(with_keys(conn, stmt, [posts.c.tenant_id, posts.c.post_id], part)):
            found[(str(row[0]), str(row[1]))] = (str(row[2]), row[3] is not None)
    return found


def _stored(conn: Connection, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The stored decisions among ``keys``: what a re-import compares."""
    d = decisions
    out: dict[str, dict[str, Any]] = {}
    for part in _chunks(sorted(set(keys))):
        stmt = sa.select(d.c.decision_key, *(d.c[c] for c in _COMPARED)).where(
            d.c.decision_key.in_(list(part))
        )
        for row in conn.execute(stmt):
            out[str(row.decision_key)] = {c: row._mapping[c] for c in _COMPARED}
    return out


def write_decisions(
    engine: Engine,
    source: str,
    batch: Sequence[Decision | Rejection],
    versions: PolicyVersions,
    summary: DecisionsSummary,
    hook: BatchHook | None = None,
) -> None:
    """Check, keep and apply one batch of decisions in one transaction; a refused row is
    recorded in ``rejected_records`` under ``source`` with its line and reason. ``hook`` runs
    inside the transaction last (a database source moves its high-water mark there)."""
    with write_tx(engine) as conn:
        _write(conn, source, batch, versions, summary)
        if hook is not None:
            hook(conn, batch)


def _write(
    conn: Connection,
    source: str,
    batch: Sequence[Decision | Rejection],
    versions: PolicyVersions,
    summary: DecisionsSummary,
) -> None:
    rejects = [r for r in batch if isinstance(r, Rejection)]
    given = [d for d in batch if isinstance(d, Decision)]
    known = _posts_of(conn, [(d.tenant_id, d.post_id) for d in given])
    accepted: list[dict[str, Any]] = []
    now = utcnow()
    for d in given:
        key_version, refused = _check_policy(conn, d, versions)
        post = known.get((d.tenant_id, d.post_id))
        if refused is None and post is None:
            # The store's key is (tenant, post): a decision never reaches another's post.
            refused = _reject(d, f"no such post of tenant {d.tenant_id} in the store")
        elif refused is None and post is not None and post[1]:
            refused = _reject(d, f"tenant {d.tenant_id} holds gold sets, not posts to moderate")
        if refused is not None or post is None:
            rejects.append(refused or _reject(d, "no such post"))
            continue
        accepted.append(
            {
                "decision_key": decision_key(
                    d.tenant_id, d.post_id, d.policy_id, d.reviewer_id, d.decided_at
                ),
                "tenant_id": d.tenant_id,
                "post_id": d.post_id,
                "policy_id": d.policy_id,
                "policy_version": d.policy_version,
                "key_version": key_version,
                "label": d.label,
                "rule_ids": d.rule_ids,
                "reviewer_id": d.reviewer_id,
                "decided_at": d.decided_at,
                "reason_code": d.reason_code,
                "content_hash": post[0],
                "imported_at": now,
            }
        )
    stored = _stored(conn, [r["decision_key"] for r in accepted])
    _save(conn, _count(summary, accepted, stored))
    summary.new_rejects += record_rejects(conn, source, rejects)
    summary.rejected += sum(r.rows for r in rejects)
    keys = [(r["tenant_id"], r["post_id"], r["policy_id"]) for r in accepted]
    _add_applied(summary.applied, apply_decisions(conn, keys))


def _count(
    summary: DecisionsSummary, accepted: Sequence[dict[str, Any]], stored: dict[str, Any]
) -> list[dict[str, Any]]:
    """Count each row as new, updated or unchanged against what came before it (the store,
    or an earlier line of the batch about the same decision, which the later line replaces);
    the rows to write: those the store does not hold as they are."""
    seen: dict[str, dict[str, Any]] = {}
    for row in accepted:
        key = row["decision_key"]
        prior = seen.get(key) or stored.get(key)
        if prior is None:
            summary.imported += 1
        elif all(prior[c] == row[c] for c in _COMPARED):
            summary.unchanged += 1
        else:
            summary.updated += 1
        seen[key] = row
    return [
        row
        for key, row in seen.items()
        if key not in stored or any(stored[key][c] != row[c] for c in _COMPARED)
    ]


_COLUMNS = (
    "decision_key",
    "tenant_id",
    "post_id",
    "policy_id",
    "policy_version",
    "key_version",
    "label",
    "rule_ids",
    "reviewer_id",
    "decided_at",
    "reason_code",
    "content_hash",
    "imported_at",
)
# An update keeps the text the decision was first imported against (the module's docstring).
_ON_KEY = "ON CONFLICT (decision_key) DO UPDATE SET " + ", ".join(
    f"{c} = excluded.{c}" for c in (*_COMPARED, "imported_at")
)


def _save(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert new decisions and update changed ones, straight to the driver (COPY and one
    INSERT ... SELECT on PostgreSQL): SQLAlchemy's per-row parameters cost more than the
    write at a million decisions."""
    dialect = conn.dialect.name
    times = [
        {
            "decided_at": db_time(dialect, r["decided_at"]),
            "imported_at": db_time(dialect, r["imported_at"]),
        }
        for r in rows
    ]
    insert_rows(
        conn, decisions, _COLUMNS, [r | t for r, t in zip(rows, times, strict=True)], _ON_KEY
    )
