"""Carrying out a stored deadline plan: batch first, the synchronous tiers beside it, then the
switch-over.

Each step is resumable, because the plan (with its deadline and switch-over) is stored and
every key's state is in the store (``ledger/spend/deadline_plans.py``):

1. ``submit``: the plan's batch keys, per tenant, go into chunks at the provider.
2. ``sync``: every other pending key (a key in an open chunk is not pending) is sent: with
   flex, each tenant's planned share of flex keys at flex and the rest at standard, the split
   ``domain/money/tier_split.py``'s ``sync_split`` made for the plan (so the run pays what the plan
   priced). Flex that stays refused longer than the plan can spare falls back to standard
   (``flex_fallback_after_s``), and from the plan's ``flex_until`` every key goes at standard
   (``standard_from``): flex's unavailability costs money, not the deadline.
3. ``wait``: the batches are polled until they end or the switch-over comes. Then every open
   batch is cancelled, and waited for until it has ended: a line may still complete and bill
   while it is ``cancelling`` (the plan allowed for that time; a cancel that takes longer is
   still waited for, logged, and the deadline may be missed by the overrun). What a batch
   completed is booked (and billed), the rest is pending again.
4. ``rescue``: what is still pending goes at standard, the tier bounded by the limit alone.

The caller then runs the usual Dagster run, which materialises, checks and applies every
partition (and sends anything still pending, at standard). A key is never paid twice: a key is
either in an open chunk or pending, never both, and each step sends only pending keys.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Engine

from backfill_assets.config.settings import Settings
from backfill_assets.defs.model_resources import model_resource
from backfill_assets.defs.partitions import partition_ref, tenant_partition_keys
from backfill_assets.defs.resources import RunResource
from backfill_assets.dispatch.partition_run import PartitionRef, PartitionReport, RunStopped
from backfill_assets.dispatch.pipeline import run_partitions
from backfill_assets.domain.money.flex_quota import FlexQuota
from backfill_assets.domain.money.nanos import usd_text
from backfill_assets.ledger.engine import read_tx, write_tx
from backfill_assets.ledger.engines import store_engine
from backfill_assets.ledger.run.posts import slice_levels
from backfill_assets.ledger.run.work import sendable_count
from backfill_assets.ledger.spend import deadline_plans
from backfill_assets.ledger.spend.deadline_plans import StoredPlan
from backfill_assets.providers.models.base import ModelAdapter
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.runner.deadline_plan import uses_flex

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


def flex_patience_s(flex_until: dt.datetime, now: dt.datetime) -> float:
    """How long flex may stay refused before the rest goes to standard: half of the time the
    plan leaves flex."""
    return max(_MIN_FLEX_PATIENCE_S, (flex_until - now).total_seconds() / 2.0)


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
        self.engine = store_engine(settings.store)
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
        if not _pending(settings, self.plan.tenants()):
            step.skipped = "nothing pending outside the batches"
            return step
        batch: dict[str, Any] = {"dispatch": "sync"}
        model: dict[str, Any] = {}
        run: dict[str, Any] = {}
        flex_until = self.plan.flex_until
        flex = uses_flex(settings) and flex_until is not None
        quota: FlexQuota | None = None
        if flex:
            assert flex_until is not None
            patience = flex_patience_s(utc(flex_until), self.now())
            # Refused keys wait a growing back-off; bounded here so that once the rest goes
            # at standard they are not still asleep.
            pause = max(0.5, min(settings.run.retry_max_seconds, patience / 8))
            model |= {"flex_fallback": "standard", "flex_fallback_after_s": patience}
            run |= {
                "retry_max_seconds": pause,
                "retry_base_seconds": min(settings.run.retry_base_seconds, pause),
            }
            quota = FlexQuota(self._flex_left())
        elif uses_flex(settings):
            model["service_tier"] = "standard"  # the plan put no key on flex
        until = utc(flex_until).timestamp() if flex and flex_until is not None else None
        chosen = settings.replace(batch=batch, model=model, run=run)
        made = _run(chosen, self.refs, step, self.log, until, quota)
        if flex:
            calls = sum(a.stats.calls for a in made)
            refused = sum(a.stats.capacity_unavailable for a in made)
            with write_tx(self.engine) as conn:
                deadline_plans.add_flex_calls(conn, self.plan.plan_id, calls, refused)
        return step

    def _flex_left(self) -> dict[str, int]:
        """The plan's flex keys per tenant less those a run of it already booked at flex."""
        with read_tx(self.engine) as conn:
            sent = deadline_plans.flex_booked(conn, self.plan, self.settings.versions().model)
        return {t: max(0, n - sent.get(t, 0)) for t, n in self.plan.flex_quota().items()}

    def wait(self) -> StepReport:
        step = StepReport("wait")
        if not self.has_batch:
            step.skipped = "nothing on batch"
            return step
        # Nothing new is chunked: keys a batch returns unrun are left to the rescue.
        _run(
            self.settings,
            self.refs,
            step,
            self.log,
            quota={},
            switch_at=self.switch_at,
            cancel_s=self.plan.rates().batch_cancel_s,
        )
        if self._past_switch():
            with write_tx(self.engine) as conn:
                deadline_plans.mark(conn, self.plan.plan_id, "switched")
        return step

    def rescue(self) -> StepReport:
        step = StepReport("rescue")
        if not _pending(self.settings, self.plan.tenants()):
            step.skipped = "nothing pending"
            return step
        standard = self.settings.replace(
            batch={"dispatch": "sync"}, model={"service_tier": "standard"}
        )
        _run(standard, self.refs, step, self.log)
        return step


def _pending(settings: Settings, tenants: Sequence[str]) -> int:
    with read_tx(store_engine(settings.store)) as conn:
        return sendable_count(conn, tenants, settings.versions())


def _run(
    settings: Settings,
    refs: Sequence[PartitionRef],
    step: StepReport,
    log: Callable[[str], None],
    flex_until: float | None = None,
    flex_quota: FlexQuota | None = None,
    **batch: Any,
) -> list[ModelAdapter]:
    """One step over ``refs``: batch mode with ``batch`` options, else sync mode (when the
    tier is flex: ``flex_quota``'s keys at flex up to ``flex_until``, an epoch second)."""
    if batch:
        settings = settings.replace(batch={"dispatch": "batch"})
    model = model_resource(settings)
    options = RunResource.of(settings).run_options(model, settings.drills.faults())
    if batch:
        assert options.batch is not None
        options = dataclasses.replace(options, batch=dataclasses.replace(options.batch, **batch))
    made: list[ModelAdapter] = []

    def planned(build: Callable[[], ModelAdapter]) -> Callable[[], ModelAdapter]:
        # Every lane's adapter (the default and each region's) follows the plan's flex split.
        def make() -> ModelAdapter:
            adapter = build()
            if isinstance(adapter, OpenAIHttpModel):
                adapter.standard_from = flex_until
                adapter.flex_quota = flex_quota
            made.append(adapter)
            return adapter

        return make

    make_adapter = planned(model.build_adapter)
    lanes = options.lanes
    options = dataclasses.replace(
        options,
        lanes=dataclasses.replace(
            lanes, adapters={r: planned(build) for r, build in lanes.adapters.items()}
        ),
    )

    reports: list[PartitionReport]
    try:
        reports = run_partitions(
            store_engine(settings.store),
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
