"""Carrying out a stored deadline plan: batch first, the synchronous tiers beside it, then the
switch-over.

Each step is resumable, because the plan (with its deadline and switch-over) is stored and
every key's state is in the store (``store/deadline_plans.py``):

1. ``submit``: the plan's batch keys, per tenant, go into chunks at the provider.
2. ``sync``: every other pending key (a key in an open chunk is not pending) is sent at flex,
   or at standard. Flex that stays refused longer than the plan can spare falls back to
   standard (``flex_fallback_after_s``), and from the plan's last moment for flex every key
   goes at standard (``standard_from``): flex's unavailability costs money, not the deadline.
3. ``wait``: the batches are polled until they end or the switch-over comes. Then every open
   batch is cancelled; what it completed is booked (and billed), the rest is pending again.
4. ``rescue``: what is still pending goes at standard, the tier bounded by the limit alone.

The caller then runs the usual Dagster run, which materialises, checks and applies every
partition (and sends anything still pending, at standard). A key is never paid twice: a key is
either in an open chunk or pending, never both, and each step sends only pending keys.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Engine

from backfill_assets.core.money import usd_text
from backfill_assets.dispatch.partition_run import PartitionRef, PartitionReport, RunStopped
from backfill_assets.dispatch.pipeline import run_partitions
from backfill_assets.orchestration.deadline_plan import uses_flex
from backfill_assets.orchestration.partitions import partition_ref, tenant_partition_keys
from backfill_assets.orchestration.settings import Settings
from backfill_assets.providers.models.base import ModelAdapter
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.store import deadline_plans
from backfill_assets.store.deadline_plans import StoredPlan
from backfill_assets.store.engine import read_tx, write_tx
from backfill_assets.store.posts import slice_levels
from backfill_assets.store.work import sendable_count

# Never fall back from flex sooner than this: a short refusal is normal for flex.
_MIN_FLEX_PATIENCE_S = 1.0


@dataclass
class StepReport:
    """What one step did, for ``run --json`` and the log."""

    name: str
    keys_finished: int = 0
    calls: int = 0
    cost_nanos: int = 0
    skipped: str = ""
    stopped: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, with the cost as exact decimal dollars too."""
        return {**dataclasses.asdict(self), "cost_usd": usd_text(self.cost_nanos)}


@dataclass
class Carried:
    """The steps of one ``run --deadline`` of a plan."""

    plan: StoredPlan
    steps: list[StepReport] = field(default_factory=list)
    # When the model work ended: every key booked, dead-lettered or deferred.
    done_at: dt.datetime | None = None

    @property
    def stopped(self) -> str:
        return next((s.stopped for s in self.steps if s.stopped), "")


def utc(naive: dt.datetime) -> dt.datetime:
    """A stored (naive UTC) time as an aware one."""
    return naive.replace(tzinfo=dt.UTC)


def plan_refs(engine: Engine, tenants: Sequence[str]) -> list[PartitionRef]:
    """Every partition of ``tenants`` at their current slice level."""
    with read_tx(engine) as conn:
        levels = slice_levels(conn, list(tenants))
    return [
        partition_ref(key).at_level(level)
        for tenant, level in sorted(levels.items())
        for key in tenant_partition_keys(tenant, level)
    ]


def _flex_window(plan: StoredPlan, sync_keys: int, now: dt.datetime) -> tuple[float, float]:
    """(seconds the window leaves beyond what standard needs for ``sync_keys``, that need)."""
    doc = plan.plan
    window_end = utc(plan.deadline) - (utc(plan.deadline) - utc(plan.created_at)) * float(
        doc["margin"]
    )
    sync_rate = plan.sync_per_s
    need_s = sync_keys / sync_rate if sync_rate > 0 else math.inf
    return (window_end - now).total_seconds() - need_s, need_s


def flex_patience_s(plan: StoredPlan, sync_keys: int, now: dt.datetime) -> float:
    """How long flex may stay refused before the rest goes to standard: half of what the
    plan's window leaves beyond the time standard needs for ``sync_keys``."""
    spare_s, _ = _flex_window(plan, sync_keys, now)
    return max(_MIN_FLEX_PATIENCE_S, spare_s / 2.0)


def standard_from(plan: StoredPlan, sync_keys: int, now: dt.datetime) -> float:
    """The epoch second from which every synchronous key goes at standard, whatever flex
    does: the window's end less twice what standard needs for ``sync_keys`` (a flex that
    answers, but slowly, must not eat that time either)."""
    spare_s, need_s = _flex_window(plan, sync_keys, now)
    return (now + dt.timedelta(seconds=max(0.0, spare_s - need_s))).timestamp()


def carry_out(
    settings: Settings,
    plan: StoredPlan,
    log: Callable[[str], None],
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    on_step: Callable[[], object] = lambda: None,
) -> Carried:
    """Steps 1 to 4 of ``plan``; a run-level refusal stops them (``Carried.stopped``).
    ``on_step`` is called before the first step and after each one (progress in the UI)."""
    run = _Steps(settings, plan, log, now)
    carried = Carried(plan)
    on_step()
    for step in (run.submit, run.sync, run.wait, run.rescue):
        report = step()
        carried.steps.append(report)
        if not report.skipped:
            on_step()
        if report.stopped:
            return carried
    carried.done_at = now()
    return carried


class _Steps:
    """The steps of one plan over its tenants' partitions."""

    def __init__(
        self,
        settings: Settings,
        plan: StoredPlan,
        log: Callable[[str], None],
        now: Callable[[], dt.datetime],
    ) -> None:
        self.settings, self.plan, self.log, self.now = settings, plan, log, now
        self.engine = settings.store_engine()
        self.refs = plan_refs(self.engine, plan.tenants())
        self.switch_at = None if plan.switch_over is None else utc(plan.switch_over).timestamp()
        self.has_batch = any(plan.batch_quota().values())

    def _past_switch(self) -> bool:
        return self.switch_at is not None and self.now().timestamp() >= self.switch_at

    def submit(self) -> StepReport:
        step = StepReport("submit")
        if not self.has_batch:
            step.skipped = "nothing on batch"
        elif self.plan.submitted_at is not None:
            step.skipped = "done by an earlier run"
        elif self._past_switch():
            step.skipped = "past the switch-over"
        else:
            quota = self.plan.batch_quota()
            _run(self.settings, self.refs, step, self.log, quota=quota, submit_only=True)
            if not step.stopped:
                with write_tx(self.engine) as conn:
                    deadline_plans.mark(conn, self.plan.plan_id, "submitted")
        return step

    def sync(self) -> StepReport:
        step = StepReport("sync")
        settings = self.settings
        pending = _pending(settings, self.plan.tenants())
        if not pending:
            step.skipped = "nothing pending outside the batches"
            return step
        flex = uses_flex(settings)
        update: dict[str, Any] = {"dispatch": "sync"}
        if flex:
            patience = flex_patience_s(self.plan, pending, self.now())
            # Refused keys wait a growing back-off; bounded here so that once the rest goes
            # at standard they are not still asleep.
            pause = max(0.5, min(settings.retry_max_seconds, patience / 8))
            update |= {
                "flex_fallback": "standard",
                "flex_fallback_after_s": patience,
                "retry_max_seconds": pause,
                "retry_base_seconds": min(settings.retry_base_seconds, pause),
            }
        until = standard_from(self.plan, pending, self.now()) if flex else None
        made = _run(settings.model_copy(update=update), self.refs, step, self.log, until)
        if flex:
            calls = sum(a.stats.calls for a in made)
            refused = sum(a.stats.capacity_unavailable for a in made)
            with write_tx(self.engine) as conn:
                deadline_plans.add_flex_calls(conn, self.plan.plan_id, calls, refused)
        return step

    def wait(self) -> StepReport:
        step = StepReport("wait")
        if not self.has_batch:
            step.skipped = "nothing on batch"
            return step
        # Nothing new is chunked: keys a batch returns unrun are left to the rescue.
        _run(self.settings, self.refs, step, self.log, quota={}, switch_at=self.switch_at)
        if self._past_switch():
            with write_tx(self.engine) as conn:
                deadline_plans.mark(conn, self.plan.plan_id, "switched")
        return step

    def rescue(self) -> StepReport:
        step = StepReport("rescue")
        if not _pending(self.settings, self.plan.tenants()):
            step.skipped = "nothing pending"
            return step
        update = {"dispatch": "sync", "service_tier": "standard"}
        _run(self.settings.model_copy(update=update), self.refs, step, self.log)
        return step


def _pending(settings: Settings, tenants: Sequence[str]) -> int:
    with read_tx(settings.store_engine()) as conn:
        return sendable_count(conn, tenants, settings.versions())


def _run(
    settings: Settings,
    refs: Sequence[PartitionRef],
    step: StepReport,
    log: Callable[[str], None],
    flex_until: float | None = None,
    **batch: Any,
) -> list[ModelAdapter]:
    """One step over ``refs``: batch mode with ``batch`` options, else sync mode (flex up to
    ``flex_until``, an epoch second, when the tier is flex)."""
    if batch:
        settings = settings.model_copy(update={"dispatch": "batch"})
    model = settings.model_resource()
    options = settings.run_settings().run_options(model, settings.faults())
    if batch:
        assert options.batch is not None
        options = dataclasses.replace(options, batch=dataclasses.replace(options.batch, **batch))
    made: list[ModelAdapter] = []

    def make_adapter() -> ModelAdapter:
        adapter = model.build_adapter()
        if isinstance(adapter, OpenAIHttpModel):
            adapter.standard_from = flex_until
        made.append(adapter)
        return adapter

    reports: list[PartitionReport]
    try:
        reports = run_partitions(
            settings.store_engine(),
            refs,
            make_adapter,
            settings.versions(),
            settings.rubric(),
            f"deadline-{step.name}-{uuid.uuid4().hex[:8]}",
            options,
            log=lambda m: log(f"{step.name}: {m}"),
        )
    except RunStopped as exc:
        step.stopped = str(exc)
        reports = exc.reports
    for rep in reports:
        step.keys_finished += sum(rep.stats.outcomes.values())
        step.calls += rep.stats.calls
        step.cost_nanos += rep.stats.cost_nanos
    return made
