"""Deadline plans being carried out: created once, then resumed until finished."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.store.tables import deadline_plans, utcnow

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
        return {t["tenant"]: int(t["keys"]["batch"]) for t in self.plan["tenants"]}

    @property
    def sync_per_s(self) -> float:
        """Keys per second the plan assumed of the synchronous tiers together: flex's rate
        when it planned flex (standard then takes what flex refuses), else standard's."""
        rates = self.plan["rates"]
        return float(rates["flex_per_s"]) or float(rates["standard_per_s"])

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
