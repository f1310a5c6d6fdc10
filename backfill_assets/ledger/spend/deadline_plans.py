"""Deadline plans being carried out: created once, then resumed until finished."""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.domain.money.prices import Tier
from backfill_assets.domain.money.tier_split import Rates
from backfill_assets.domain.work.events import EventKind
from backfill_assets.ledger.tables import deadline_plans, ledger_events, utcnow

STEPS = ("submitted", "switched", "finished")


@dataclass(frozen=True, slots=True)
class StoredPlan:
    """A plan as stored: times are naive UTC, ``plan`` is the plan's JSON document."""

    plan_id: str
    code_version: str
    created_at: datetime
    deadline: datetime
    switch_over: datetime | None
    plan: dict[str, Any]
    submitted_at: datetime | None
    switched_at: datetime | None
    finished_at: datetime | None

    def batch_quota(self) -> dict[str, int]:
        """Keys per tenant the plan puts on batch."""
        return self._keys(Tier.BATCH)

    def flex_quota(self) -> dict[str, int]:
        """Keys per tenant the plan puts on flex."""
        return self._keys(Tier.FLEX)

    def _keys(self, tier: Tier) -> dict[str, int]:
        return {t["tenant"]: int(t["keys"][tier.value]) for t in self.plan["tenants"]}

    def rates(self) -> Rates:
        """The rates the plan assumed."""
        r = self.plan["rates"]
        completion = r["batch_completion_s"]
        standard = float(r["standard_per_s"])
        if "batch_cancel_s" not in r:
            # Stored before cancels were planned for: standard's rate was then the share flex
            # refused, and the whole limit flex's.
            standard = float(r["flex_per_s"]) or standard
        return Rates(
            standard_per_s=standard,
            flex_per_s=float(r["flex_per_s"]),
            flex_unavailable=float(r["flex_unavailable"]),
            batch_completion_s=math.inf if completion is None else float(completion),
            batch_cancel_s=float(r.get("batch_cancel_s", 0.0)),
        )

    @property
    def sync_per_s(self) -> float:
        """Keys per second the plan assumed the synchronous tiers can always do."""
        return self.rates().sync_per_s

    @property
    def flex_until(self) -> datetime | None:
        """From when every synchronous key still unsent goes at standard (None: the plan put
        no key on flex, or was stored before it planned this)."""
        when = self.plan.get("flex_until")
        return None if when is None else naive_utc(datetime.fromisoformat(when))

    def tenants(self) -> list[str]:
        return [str(t["tenant"]) for t in self.plan["tenants"]]


def naive_utc(when: datetime | None) -> datetime | None:
    """Naive UTC, as every time in the store."""
    if when is None or when.tzinfo is None:
        return when
    return when.astimezone(UTC).replace(tzinfo=None)


def open_plan(conn: Connection, code_version: str) -> StoredPlan | None:
    """The unfinished plan of this code version, if any (the newest)."""
    c = deadline_plans.c
    row = conn.execute(
        sa.select(deadline_plans)
        .where(c.code_version == code_version, c.finished_at.is_(None))
        .order_by(c.created_at.desc())
        .limit(1)
    ).first()
    if row is None:
        return None
    m = row._mapping
    return StoredPlan(
        plan_id=m["plan_id"],
        code_version=m["code_version"],
        created_at=m["created_at"],
        deadline=m["deadline"],
        switch_over=m["switch_over"],
        plan=json.loads(m["plan_json"]),
        submitted_at=m["submitted_at"],
        switched_at=m["switched_at"],
        finished_at=m["finished_at"],
    )


def create_plan(
    conn: Connection,
    code_version: str,
    model: str,
    deadline: datetime,
    switch_over: datetime | None,
    plan: dict[str, Any],
) -> str:
    """Store a new plan; any other open plan of this code version is closed (replaced)."""
    c = deadline_plans.c
    now = utcnow()
    conn.execute(
        sa.update(deadline_plans)
        .where(c.code_version == code_version, c.finished_at.is_(None))
        .values(finished_at=now)
    )
    plan_id = f"plan-{uuid.uuid4().hex[:12]}"
    conn.execute(
        sa.insert(deadline_plans).values(
            plan_id=plan_id,
            code_version=code_version,
            model=model,
            created_at=now,
            deadline=naive_utc(deadline),
            switch_over=naive_utc(switch_over),
            plan_json=json.dumps(plan, sort_keys=True),
        )
    )
    return plan_id


def mark(conn: Connection, plan_id: str, step: str) -> None:
    """Record that a step of the plan is done (the first time only)."""
    if step not in STEPS:
        raise ValueError(f"unknown plan step {step!r}: expected one of {STEPS}")
    c = deadline_plans.c
    column = c[f"{step}_at"]
    conn.execute(
        sa.update(deadline_plans)
        .where(c.plan_id == plan_id, column.is_(None))
        .values({column.name: utcnow()})
    )


def add_flex_calls(conn: Connection, plan_id: str, calls: int, refused: int) -> None:
    """Count flex requests sent under the plan, and those refused for capacity."""
    c = deadline_plans.c
    conn.execute(
        sa.update(deadline_plans)
        .where(c.plan_id == plan_id)
        .values(flex_calls=c.flex_calls + calls, flex_refused=c.flex_refused + refused)
    )


def flex_booked(conn: Connection, plan: StoredPlan, model: str) -> dict[str, int]:
    """Keys per tenant of ``plan`` booked at flex since it was made (what a resumed run has
    already sent of the plan's flex keys)."""
    c = ledger_events.c
    rows = conn.execute(
        sa.select(c.tenant_id, sa.func.count(sa.distinct(c.key)))
        .where(
            c.tenant_id.in_(plan.tenants()),
            c.type == EventKind.USAGE,
            c.service_tier == Tier.FLEX.value,
            c.model == model,
            c.at >= plan.created_at,
        )
        .group_by(c.tenant_id)
    ).all()
    return {str(t): int(n) for t, n in rows}


def flex_history(conn: Connection, model: str) -> tuple[int, int]:
    """(flex requests sent, refused for capacity) under every plan for ``model``."""
    c = deadline_plans.c
    calls, refused = conn.execute(
        sa.select(
            sa.func.coalesce(sa.func.sum(c.flex_calls), 0),
            sa.func.coalesce(sa.func.sum(c.flex_refused), 0),
        ).where(c.model == model)
    ).one()
    return int(calls), int(refused)
