"""``run --deadline WHEN``: the least-cost plan over batch, flex and standard that ends in time,
and its execution.

``--dry-run`` prints the plan and sends nothing. Otherwise the plan is stored with its deadline
and carried out (``runner/deadline_run.py``), then the usual Dagster run records it;
the next ``run --deadline`` resumes an unfinished plan (``--replan`` replaces it). Either way an
impossible deadline is refused (exit 2) before anything is sent, unless ``--best-effort``.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from backfill_assets.cli.tables import Human, table, tell
from backfill_assets.domain.errors import UserError
from backfill_assets.domain.money import DeadlineError, DeadlinePlan, Tier, parse_deadline, usd
from backfill_assets.runner.api import (
    NoLimitKnown,
    NoTiersToMix,
    carry_out,
    plan_deadline,
    utc,
)
from backfill_assets.runner.queries import (
    StoredPlan,
    create_plan,
    mark,
    open_plan,
    read_tx,
    store_engine,
    write_tx,
)

if TYPE_CHECKING:
    from backfill_assets.config.settings import Settings

PLAN_COLUMNS = ["tenant", "batch", "flex", "standard", "cost_usd", "over_budget"]
# The record run: every partition of the plan's tenants through Dagster, with these settings.
Record = Callable[["Settings", list[str]], tuple[dict[str, Any], list[Human]]]


def _log(message: str) -> None:
    tell(message)


def cmd_run_deadline(
    args: argparse.Namespace,
    settings: Settings,
    tenants: list[str],
    record: Record,
    progress: Callable[[], object] = lambda: None,
) -> tuple[int, dict[str, object], list[Human]]:
    """Plan (and unless ``--dry-run`` carry out) ``tenants``' backfill by the deadline, as
    (exit code, JSON document, human lines)."""
    now = dt.datetime.now(dt.UTC)
    engine = store_engine(settings.store)
    versions = settings.versions()
    with read_tx(engine) as conn:
        stored = open_plan(conn, versions.code_version)
    if stored is not None and not args.dry_run and not args.replan:
        return _carry(args, settings, stored, True, [], record, progress, tenants)
    try:
        deadline = parse_deadline(args.deadline, now)
        plan = plan_deadline(settings, tenants, deadline, args.margin, now)
    except (DeadlineError, NoLimitKnown, NoTiersToMix) as exc:
        raise UserError(f"--deadline: {exc}") from None
    doc: dict[str, object] = {"ok": plan.feasible, "dry_run": args.dry_run, "plan": plan.as_dict()}
    human = plan_lines(plan)
    if stored is not None:
        human.append(
            f"note: plan {stored.plan_id} (deadline {stored.deadline:%Y-%m-%d %H:%M:%S}Z) is "
            "unfinished: `run --deadline` resumes it, `--replan` replaces it"
        )
    if not plan.feasible and not args.best_effort:
        human.append("the deadline cannot be met: nothing was sent (--best-effort to try anyway)")
        return 2, doc, human
    if args.dry_run:
        return 0, doc, human
    with write_tx(engine) as conn:
        create_plan(
            conn, versions.code_version, versions.model, deadline, plan.switch_over, plan.as_dict()
        )
        created = open_plan(conn, versions.code_version)
    assert created is not None
    return _carry(args, settings, created, False, human, record, progress, tenants)


def _carry(
    args: argparse.Namespace,
    settings: Settings,
    plan: StoredPlan,
    resumed: bool,
    human: list[Human],
    record: Record,
    progress: Callable[[], object],
    tenants: list[str],
) -> tuple[int, dict[str, object], list[Human]]:
    """Carry ``plan`` out, then record it with a Dagster run at the standard tier."""
    if resumed:
        switched = (
            f", switched over {plan.switched_at:%Y-%m-%d %H:%M:%S}Z" if plan.switched_at else ""
        )
        human.append(
            f"resuming plan {plan.plan_id} made {plan.created_at:%Y-%m-%d %H:%M:%S}Z: deadline "
            f"{plan.deadline:%Y-%m-%d %H:%M:%S}Z as stored{switched} (`--replan` for a new one)"
        )
        _log(str(human[-1]))
    carried = carry_out(settings, plan, _log, on_step=progress)
    info: dict[str, Any] = {
        "plan_id": plan.plan_id,
        "resumed": resumed,
        "deadline": utc(plan.deadline).isoformat(),
        "switch_over": None if plan.switch_over is None else utc(plan.switch_over).isoformat(),
        "plan": plan.plan,
        "steps": [s.as_dict() for s in carried.steps],
    }
    human += [
        f"{s.name}: skipped ({s.skipped})"
        if s.skipped
        else f"{s.name}: {s.keys_finished} key(s) finished, {s.calls} call(s), ${usd(s.cost_nanos)}"
        for s in carried.steps
    ]
    if carried.stopped:
        human.append(f"stopped: {carried.stopped}; `run --deadline` again resumes the plan")
        return 1, {"ok": False, "deadline": info}, human
    assert carried.done_at is not None
    # Anything still pending (a key that came back after the rescue) goes at standard.
    chosen = settings.replace(batch={"dispatch": "sync"}, model={"service_tier": "standard"})
    doc, run_human = record(chosen, plan.tenants() or tenants)
    recorded = dt.datetime.now(dt.UTC)
    with write_tx(store_engine(settings.store)) as conn:
        mark(conn, plan.plan_id, "finished")
    # The deadline is for the labels: the model work, not the bookkeeping after it.
    met = carried.done_at <= utc(plan.deadline)
    info |= {
        "labelled_at": carried.done_at.isoformat(),
        "recorded_at": recorded.isoformat(),
        "met": met,
    }
    human += run_human
    human.append(
        f"plan {plan.plan_id}: labelled {carried.done_at:%Y-%m-%d %H:%M:%S}Z, deadline "
        f"{plan.deadline:%Y-%m-%d %H:%M:%S}Z {'met' if met else 'MISSED'}; recorded "
        f"{recorded:%H:%M:%S}Z"
    )
    ok = bool(doc["ok"]) and (met or args.best_effort)
    return (0 if ok else 1), {**doc, "ok": ok, "deadline": info}, human


def plan_lines(plan: DeadlinePlan) -> list[Human]:
    """The plan as a table per tenant and the lines an operator reads first."""
    rows = [
        {
            "tenant": p.tenant,
            "batch": p.keys.get(Tier.BATCH, 0),
            "flex": p.keys.get(Tier.FLEX, 0),
            "standard": p.keys.get(Tier.STANDARD, 0),
            "cost_usd": f"{p.cost:.6f}",
            "over_budget": "yes" if p.over_budget else "",
        }
        for p in plan.tenants
    ]
    keys = plan.keys
    r = plan.rates
    lines: list[Human] = [
        table(rows if len(rows) <= 48 else rows[:48], PLAN_COLUMNS),
        f"keys: {keys[Tier.BATCH]} batch, {keys[Tier.FLEX]} flex, {keys[Tier.STANDARD]} standard;"
        f" expected cost ${plan.cost:.6f} (all standard ${plan.cost_all_standard:.6f},"
        f" all batch ${plan.cost_all_batch:.6f})",
        f"deadline {plan.deadline:%Y-%m-%d %H:%M:%S}Z, expected finish"
        f" {plan.expected_finish:%Y-%m-%d %H:%M:%S}Z, margin {plan.margin:.0%}",
        f"assumed: standard {r.standard_per_s:.2f} keys/s,"
        f" flex {r.flex_effective_per_s:.2f} keys/s"
        + (f" ({r.flex_unavailable:.0%} refused)" if r.flex_per_s else "")
        + (
            f", a batch completes in {r.batch_completion_s / 3600:.2f} h and a cancel in"
            f" {r.batch_cancel_s:.0f} s"
            if r.has_batch
            else ", no batch tier (BACKFILL_MODEL_BACKEND=openai has one)"
        ),
    ]
    if len(rows) > 48:
        lines.insert(1, f"... and {len(rows) - 48} more tenant(s) (--json has every one)")
    if plan.switch_over is not None:
        lines.append(
            f"switch-over {plan.switch_over:%Y-%m-%d %H:%M:%S}Z: open batches are then"
            " cancelled and, once the cancels have ended, keys still waiting on batch go to"
            " the synchronous tiers, or the deadline is missed"
        )
    if plan.flex_until is not None:
        lines.append(
            f"flex until {plan.flex_until:%Y-%m-%d %H:%M:%S}Z: synchronous keys still unsent"
            " then go at standard, or the deadline is missed"
        )
    lines += [f"note: {reason}" for reason in plan.reasons]
    return lines
