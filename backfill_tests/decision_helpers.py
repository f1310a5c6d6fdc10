"""One moderator's decision, stored and applied as ``decisions import`` does, for the tests
that need decisions without going through a file."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.domain.policy.document import Policy
from backfill_assets.ledger.decisions.precedence import (
    DecisionsApplied,
    apply_decisions,
    decision_key,
)
from backfill_assets.ledger.engine import write_tx
from backfill_assets.ledger.tables import decisions, posts, utcnow

DECIDED_AT = dt.datetime(2026, 12, 1, 12, 0)


def record_decision(
    engine: Engine,
    tenant: str,
    post_id: str,
    label: str,
    *,
    policy: Policy,
    rules: str = "",
    at: dt.datetime = DECIDED_AT,
    reviewer: str = "mod-7",
    key_version: str | None = None,
    content_hash: str | None = None,
) -> DecisionsApplied:
    """A decision about the post's current text (unless ``content_hash`` says another) under
    ``policy`` (its key version unless ``key_version``), inserted then applied."""
    with write_tx(engine) as conn:
        text_hash = (
            content_hash
            or conn.execute(
                sa.select(posts.c.content_hash).where(
                    posts.c.tenant_id == tenant, posts.c.post_id == post_id
                )
            ).scalar_one()
        )
        conn.execute(
            decisions.insert().values(
                decision_key=decision_key(tenant, post_id, policy.policy_id, reviewer, at),
                tenant_id=tenant,
                post_id=post_id,
                policy_id=policy.policy_id,
                policy_version=policy.version,
                key_version=key_version or policy.key_version,
                label=label,
                rule_ids=",".join(sorted(r for r in rules.split(",") if r)),
                reviewer_id=reviewer,
                decided_at=at,
                reason_code=None,
                content_hash=text_hash,
                imported_at=utcnow(),
            )
        )
        return apply_decisions(conn, [(tenant, post_id, policy.policy_id)])
