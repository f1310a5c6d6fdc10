"""``run --deadline WHEN``: the least-cost plan over batch, flex and standard that ends in time.

Planning is built (``--dry-run``); executing a mixed plan is not yet, so without ``--dry-run``
the command refuses rather than run a plan it cannot follow. Either way an impossible
deadline is refused (exit 2) before anything is sent, unless ``--best-effort``.
"""

from __future__ import annotations

import argparse
import datetime as dt

from backfill_assets.cli.inputs import UserError
from backfill_assets.cli.tables import Human, table
from backfill_assets.core.deadline import DeadlineError, DeadlinePlan, parse_deadline
from backfill_assets.core.prices import Tier
from backfill_assets.orchestration.deadline_plan import NoLimitKnown, plan_deadline
from backfill_assets.orchestration.settings import Settings

PLAN_COLUMNS = ["tenant", "batch", "flex", "standard", "cost_usd", "over_budget"]


def margin_share(raw: str) -> float:
    """``--margin``: a percentage of the time left (``10`` or ``10%``), 0 to 90."""
    try:
        value = float(raw.strip().rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a percentage") from None
    if not 0.0 <= value <= 90.0:
        raise argparse.ArgumentTypeError(f"{raw!r} must be within 0 and 90 (percent)")
    return value / 100.0


def cmd_run_deadline(
    args: argparse.Namespace, settings: Settings, tenants: list[str]
) -> tuple[int, dict[str, object], list[Human]]:
    """The plan for ``tenants`` as (exit code, JSON document, human lines)."""
    now = dt.datetime.now(dt.UTC)
    try:
        deadline = parse_deadline(args.deadline, now)
        plan = plan_deadline(settings, tenants, deadline, args.margin, now)
    except (DeadlineError, NoLimitKnown) as exc:
        raise UserError(f"--deadline: {exc}") from None
    doc: dict[str, object] = {"ok": plan.feasible, "dry_run": args.dry_run, "plan": plan.as_dict()}
    human = plan_lines(plan)
    if not plan.feasible and not args.best_effort:
        human.append("the deadline cannot be met: nothing was sent (--best-effort to try anyway)")
        return 2, doc, human
    if not args.dry_run:
        raise UserError(
            "--deadline: executing a deadline plan is not built yet; "
            "`run --deadline WHEN --dry-run` prints the plan, `BACKFILL_DISPATCH` picks one tier"
        )
    return 0, doc, human


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
        f" flex {r.flex_effective_per_s:.2f} keys/s,"
        f" a batch completes in {r.batch_completion_s / 3600:.2f} h",
    ]
    if len(rows) > 48:
        lines.insert(1, f"... and {len(rows) - 48} more tenant(s) (--json has every one)")
    if plan.switch_over is not None:
        lines.append(
            f"switch-over {plan.switch_over:%Y-%m-%d %H:%M:%S}Z: keys still waiting on batch"
            " then go to the synchronous tiers, or the deadline is missed"
        )
    lines += [f"note: {reason}" for reason in plan.reasons]
    return lines
