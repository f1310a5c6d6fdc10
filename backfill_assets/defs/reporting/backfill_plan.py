"""backfill_plan: what a backfill would send and cost, per tenant, before anyone launches it.

An operator about to launch from the UI sees here, without a terminal, each tenant's pending
keys, the estimated tokens and cost, and the upper bound a strict budget reserves. Refreshed by
the daemon after every import (it depends on ``posts``) and on demand.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import dagster as dg

from backfill_assets.config.variables import StoreSettings
from backfill_assets.defs.asset_keys import POSTS
from backfill_assets.defs.model_resources import ModelResource, stage_models, versions_for
from backfill_assets.defs.sealing import NO_CONFIG
from backfill_assets.defs.sensors import refresh_condition
from backfill_assets.domain.money.nanos import usd_text, whole_nanos
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.ledger.engine import read_tx
from backfill_assets.ledger.engines import store_engine
from backfill_assets.ledger.evaluations import gold_shares
from backfill_assets.ledger.reports import tenant_ids
from backfill_assets.ledger.spend.deadline_plans import StoredPlan, open_plan
from backfill_assets.ledger.spend.estimate import TenantEstimate, estimate_pending

# The table is for reading in the UI; `backfill-moderation dry-run --json` has every tenant.
MAX_TABLE_ROWS = 100


def plan_table(rows: list[TenantEstimate], limit: int = MAX_TABLE_ROWS) -> str:
    """Markdown table of the tenants with the most pending keys first."""
    lines = [
        "| tenant | pending keys | est. tokens | est. cost (USD) | reserved bound "
        "| bound cost (USD) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    busiest = sorted(rows, key=lambda r: (-r.keys, r.tenant))
    for r in busiest[:limit]:
        lines.append(
            f"| {r.tenant} | {r.keys} | {r.estimated_tokens} | {r.estimated_cost_usd:.6f} "
            f"| {r.bound_tokens} | {r.bound_cost_usd:.6f} |"
        )
    if len(rows) > limit:
        lines.append(f"| ... {len(rows) - limit} more: `backfill-moderation dry-run` | | | | | |")
    if not rows:
        lines.append("| (no tenants) | | | | | |")
    return "\n".join(lines)


def build_backfill_plan(rubric: Rubric) -> dg.AssetsDefinition:
    """The plan asset for the policy the definitions loaded (closed over, as the labels')."""

    @dg.asset(
        config_schema=NO_CONFIG,
        name="backfill_plan",
        group_name="reporting",
        deps=[POSTS],
        kinds={"sql"},
        automation_condition=refresh_condition(),
    )
    def backfill_plan(
        store: dg.ResourceParam[StoreSettings], model: dg.ResourceParam[ModelResource]
    ) -> dg.MaterializeResult[None]:
        """Pending keys, estimated tokens and cost, and the reserved bound, per tenant."""
        return _plan(store, model, rubric)

    return backfill_plan


def deadline_table(plan: StoredPlan, rows: list[TenantEstimate], now: dt.datetime) -> str:
    """An open deadline plan: what it put on each tier, what is left, and the ETA."""
    doc = plan.plan
    mine = set(plan.tenants())
    left = sum(r.keys for r in rows if r.tenant in mine)
    planned = sum(int(n) for n in doc["keys"].values())
    rate = plan.sync_per_s
    eta = now + dt.timedelta(seconds=left / rate) if rate > 0 and left else now
    if left and plan.switch_over is not None and plan.switched_at is None:
        # Keys on batch are done by the switch-over at the latest, then the rescue's time.
        eta = max(eta, plan.switch_over.replace(tzinfo=dt.UTC))
    deadline = plan.deadline.replace(tzinfo=dt.UTC)
    switch = "none" if plan.switch_over is None else f"{plan.switch_over:%Y-%m-%d %H:%M:%S}Z"
    steps = ", ".join(
        f"{name} {when:%H:%M:%S}Z"
        for name, when in (("submitted", plan.submitted_at), ("switched", plan.switched_at))
        if when is not None
    )
    return "\n".join(
        [
            "| plan | deadline | switch-over | batch | flex | standard | left | ETA | steps |",
            "|---|---|---|---:|---:|---:|---:|---|---|",
            f"| {plan.plan_id} | {deadline:%Y-%m-%d %H:%M:%S}Z | {switch} "
            f"| {doc['keys']['batch']} | {doc['keys']['flex']} | {doc['keys']['standard']} "
            f"| {left} of {planned} | {eta:%Y-%m-%d %H:%M:%S}Z "
            f"({'on time' if eta <= deadline else 'LATE'}) | {steps or '-'} |",
        ]
    )


def stage_plan_table(
    rows: list[TenantEstimate], shares: Mapping[str, float], limit: int = MAX_TABLE_ROWS
) -> str:
    """A cascade's expected calls and cost per tenant and stage: each stage's estimate times
    the share of posts that reach it, from the gold set's shares decided per stage."""
    lines = [
        "| tenant | stage | reaches (gold) | expected calls | expected cost (USD) |",
        "|---|---|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: (-r.keys, r.tenant))[:limit]:
        for name, part, reach in _reached(r, shares):
            calls = int(Decimal(part.keys) * reach)
            cost = whole_nanos(Decimal(part.estimated_cost_nanos) * reach)
            lines.append(f"| {r.tenant} | {name} | {reach:.1%} | {calls} | {usd_text(cost)} |")
    return "\n".join(lines)


def _reached(
    row: TenantEstimate, shares: Mapping[str, float]
) -> list[tuple[str, TenantEstimate, Decimal]]:
    """Each stage with the share of posts that reach it: all reach the first; each stage's
    decided share (on the gold set) does not reach the next."""
    out, reach = [], Decimal(1)
    for name, part in row.stages.items():
        out.append((name, part, max(reach, Decimal(0))))
        reach -= Decimal(str(shares.get(name, 0.0)))
    return out


def _plan(store: StoreSettings, model: ModelResource, rubric: Rubric) -> dg.MaterializeResult[None]:
    versions = versions_for(model, rubric)
    with read_tx(store_engine(store)) as conn:
        rows = estimate_pending(
            conn, tenant_ids(conn), versions, rubric, model.price_table(), stage_models(model)
        )
        running = open_plan(conn, versions.code_version)
        shares = (
            gold_shares(conn, versions.key_version, versions.model, versions.mapping)
            if stage_models(model) is not None
            else None
        )
    metadata: dict[str, Any] = {
        "plan": dg.MetadataValue.md(plan_table(rows)),
        # Typed numbers, so the UI can plot them across materialisations.
        "tenants_with_work": dg.MetadataValue.int(sum(1 for r in rows if r.keys)),
        "pending_keys": dg.MetadataValue.int(sum(r.keys for r in rows)),
        "estimated_tokens": dg.MetadataValue.int(sum(r.estimated_tokens for r in rows)),
        # Money as exact decimal text, never a float.
        "estimated_cost_usd": dg.MetadataValue.text(
            usd_text(sum(r.estimated_cost_nanos for r in rows))
        ),
        "reserved_bound_tokens": dg.MetadataValue.int(sum(r.bound_tokens for r in rows)),
        "reserved_bound_cost_usd": dg.MetadataValue.text(
            usd_text(sum(r.bound_cost_nanos for r in rows))
        ),
        "code_version": dg.MetadataValue.text(versions.code_version),
        "policy": dg.MetadataValue.text(rubric.policy.identity),
    }
    if shares is not None:
        # A cascade with a sweep of these decide rules: what the gold set says each stage
        # will be sent and cost (the plan above counts every post through every stage).
        metadata["stage_plan"] = dg.MetadataValue.md(stage_plan_table(rows, shares))
        expected = sum(
            whole_nanos(Decimal(part.estimated_cost_nanos) * reach)
            for r in rows
            for _n, part, reach in _reached(r, shares)
        )
        metadata["expected_cost_usd"] = dg.MetadataValue.text(usd_text(expected))
    if running is not None:
        # `run --deadline` refreshes this asset after each of its steps.
        metadata["deadline_plan"] = dg.MetadataValue.md(
            deadline_table(running, rows, dt.datetime.now(dt.UTC))
        )
    return dg.MaterializeResult(metadata=metadata)
