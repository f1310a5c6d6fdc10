"""Runs partitions through a cascade of stages (issue 49): each stage is an ordinary dispatch of
its own keys, and only the posts the stages before it passed on are sent to it.

Stage 1 gets every pending post. After it, the routes are read from what is stored
(``cascade_routes.py``) and stage 2 is sent the posts stage 1 answered without deciding, once:
a post it has answered is done under its own key. Then the cascade's labels are composed, under
the partitions' writer locks, from the deciding stages' stored results (no call). A crash at
any point loses nothing: the next run reads the same routes and re-pays at most the calls that
were in flight.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from backfill_assets.dispatch.partition_run import (
    Lanes,
    PartitionRef,
    PartitionReport,
    PartitionStats,
    RegionUnavailable,
    RunOptions,
    RunStopped,
)
from backfill_assets.dispatch.pipeline import run_partitions
from backfill_assets.domain.money.budgets import Spend
from backfill_assets.domain.money.prices import PriceTable, Tier
from backfill_assets.domain.policy.rubric import Rubric, messages_token_bound
from backfill_assets.domain.work.faults import UsageHook
from backfill_assets.domain.work.keys import Versions
from backfill_assets.ledger.engine import read_tx, write_tx
from backfill_assets.ledger.labels.cascade_routes import Post, RouteStage, route_partition
from backfill_assets.ledger.locks.writer_locks import WriterLocks
from backfill_assets.ledger.policies import register_policy
from backfill_assets.ledger.run.partition_counts import partition_counts
from backfill_assets.providers.batch_client import BatchEndpoint
from backfill_assets.providers.models.base import ModelAdapter


@dataclass(frozen=True)
class StageRun:
    """A stage as a run sends through it."""

    route: RouteStage
    rubric: Rubric
    make_adapter: Callable[[], ModelAdapter]
    lanes: Lanes
    prices: PriceTable
    # The stage's Batch API (None: its server has none; batch mode is then refused at start).
    batch: BatchEndpoint | None = None

    def call_bound(self, text: str) -> Spend:
        """The most one call of this stage can bill for ``text`` (tokens, and nano-dollars at
        the standard tier; 0 where the model has no price)."""
        r = self.rubric
        prompt = messages_token_bound(r.messages(_ANY_KEY, text), r.extra_bytes)
        out = r.max_output_tokens
        model = self.route.versions.model
        return Spend(prompt + out, self.prices.cost_bound(model, [Tier.STANDARD], prompt, out) or 0)


# Keys are 64 hex characters: what a bound counts of one, whichever post it is.
_ANY_KEY = "0" * 64


def _ahead(later: Sequence[StageRun]) -> Callable[[str], Spend] | None:
    """What the stages after one may cost for a post, reserved with each of its calls: a post
    is not screened when its tenant's budget cannot pay for the rest of its way."""
    if not later:
        return None

    def ahead(text: str) -> Spend:
        total = Spend()
        for stage in later:
            total += stage.call_bound(text)
        return total

    return ahead


def run_cascade(
    engine: Engine,
    refs: Sequence[PartitionRef],
    stages: Sequence[StageRun],
    labels: Versions,
    rubric: Rubric,
    run_id: str,
    options: RunOptions,
    log: Callable[[str], None] = lambda _m: None,
    only_posts: Collection[str] | None = None,
) -> list[PartitionReport]:
    """Send each stage the posts that reach it, then compose the cascade's labels; the reports
    sum the stages' calls and cost, and say per stage what was sent and decided.
    ``only_posts``: the first stage is sent only these posts (a gold set)."""
    register_policy(engine, rubric.policy)
    # Every stage has its row in every partition's report, in the cascade's order.
    reports = {
        r.key: PartitionReport(ref=r, stages={s.route.name: {} for s in stages}) for r in refs
    }
    route_stages = [s.route for s in stages]
    none_label = rubric.policy.none_label
    stopped: RunStopped | None = None
    unroutable: dict[str, list[str]] = {}
    drill = _Cumulative(options.after_usage) if options.after_usage is not None else None
    for k, stage in enumerate(stages):
        escalated: dict[str, set[Post]] | None = None
        todo = list(refs)
        if k > 0:
            escalated = _reaching(engine, refs, route_stages, labels, none_label, k, only_posts)
            todo = [r for r in refs if escalated.get(r.key)]
        if not todo:
            continue
        name = stage.route.name
        try:
            got = run_partitions(
                engine,
                todo,
                stage.make_adapter,
                stage.route.versions,
                stage.rubric,
                run_id,
                _stage_options(options, stage, drill, stages[k + 1 :]),
                log=_prefixed(log, name),
                only_posts=only_posts if k == 0 else None,
                escalated=escalated,
            )
        except RegionUnavailable as exc:
            got = exc.reports
            for region, keys in exc.regions.items():
                unroutable.setdefault(region, []).extend(keys)
        except RunStopped as exc:
            got, stopped = exc.reports, exc
        if drill is not None:
            drill.next_stage()
        for rep in got:
            _add(reports[rep.ref.key], rep, name, first=k == 0)
        if stopped is not None:
            break
    _compose(engine, refs, route_stages, labels, none_label, run_id, reports, log)
    _totals(engine, refs, labels, reports)
    done = [reports[r.key] for r in refs]
    if stopped is not None:
        raise RunStopped(str(stopped), done) from stopped
    if unroutable:
        raise RegionUnavailable(unroutable, done)
    return done


def _reaching(
    engine: Engine,
    refs: Sequence[PartitionRef],
    stages: Sequence[RouteStage],
    labels: Versions,
    none_label: str,
    k: int,
    only_posts: Collection[str] | None,
) -> dict[str, set[Post]]:
    """Per partition, the posts that stage ``k`` is asked about (read from stored results;
    of ``only_posts`` only, when given)."""
    out: dict[str, set[Post]] = {}
    with read_tx(engine) as conn:
        for ref in refs:
            routes = route_partition(conn, ref.tenant_id, ref.slices, stages, labels, none_label)
            reach = routes.reach[k]
            if only_posts is not None:
                reach = {p for p in reach if p[0] in only_posts}
            if reach:
                out[ref.key] = reach
    return out


def _stage_options(
    options: RunOptions, stage: StageRun, drill: UsageHook | None, later: Sequence[StageRun]
) -> RunOptions:
    """The run's options as one stage sends: its lanes and Batch API, the drill counted over
    the stages, and the bound of the stages after it, reserved with each call (or chunk)."""
    batch = options.batch
    if batch is not None:
        batch = dataclasses.replace(batch, endpoint=stage.batch)
    return dataclasses.replace(
        options, lanes=stage.lanes, batch=batch, after_usage=drill, ahead=_ahead(later)
    )


def _prefixed(log: Callable[[str], None], stage: str) -> Callable[[str], None]:
    """A stage's log lines, each saying which stage it is."""
    return lambda message: log(f"[{stage}] {message}")


def _totals(
    engine: Engine,
    refs: Sequence[PartitionRef],
    labels: Versions,
    reports: dict[str, PartitionReport],
) -> None:
    """Each partition's stored labels, rules and dead letters of the cascade, all runs."""
    with read_tx(engine) as conn:
        counts = partition_counts(conn, sorted({r.tenant_id for r in refs}), labels)
    for ref in refs:
        rep = reports[ref.key]
        for s in ref.slices:
            got = counts.get((ref.tenant_id, s))
            if got is None:
                continue
            rep.labels_total = dict(Counter(rep.labels_total) + Counter(got.labels))
            rep.rules_total = dict(Counter(rep.rules_total) + Counter(got.rules))
            rep.dead_total = dict(Counter(rep.dead_total) + Counter(got.dead))


def _compose(
    engine: Engine,
    refs: Sequence[PartitionRef],
    stages: Sequence[RouteStage],
    labels: Versions,
    none_label: str,
    run_id: str,
    reports: dict[str, PartitionReport],
    log: Callable[[str], None],
) -> None:
    """Write the cascade's labels from the stored stage results, partition by partition, each
    under its writer lock (a partition another run writes is left to that run)."""
    with WriterLocks(engine) as locks:
        busy = locks.acquire_many([(r.tenant_id, r.slice) for r in refs])
        for ref in refs:
            why = busy.get((ref.tenant_id, ref.slice))
            if why is not None:
                reports[ref.key].busy = True
                log(f"skipping {ref.key}: {why}")
                continue
            with write_tx(engine) as conn:
                routes = route_partition(
                    conn, ref.tenant_id, ref.slices, stages, labels, none_label, run_id
                )
            rep = reports[ref.key]
            rep.stats.rerouted += routes.rerouted
            for name, n in routes.decided_by.items():
                rep.stages.setdefault(name, {})["decided"] = n


def _add(into: PartitionReport, rep: PartitionReport, stage: str, *, first: bool) -> None:
    """A stage's report folded into the partition's: its calls, cost and outcomes summed."""
    if first:
        into.posts, into.pending, into.in_open_batch = rep.posts, rep.pending, rep.in_open_batch
    into.busy = into.busy or rep.busy
    _sum_stats(into.stats, rep.stats)
    st = rep.stats
    into.stages.setdefault(stage, {}).update(
        {"sent": rep.pending, "calls": st.calls, "cost_nanos": st.cost_nanos}
    )


class _Cumulative:
    """A crash drill's usage hook counted over the run's stages, not each stage's writer."""

    def __init__(self, hook: UsageHook) -> None:
        self._hook, self._before, self._last = hook, 0, 0

    def __call__(self, committed: int) -> None:
        self._last = committed
        self._hook(self._before + committed)

    def next_stage(self) -> None:
        self._before, self._last = self._before + self._last, 0


def _sum_stats(into: PartitionStats, add: PartitionStats) -> None:
    for f in dataclasses.fields(PartitionStats):
        a, b = getattr(into, f.name), getattr(add, f.name)
        if isinstance(a, Counter):
            a.update(b)
        elif isinstance(a, list):
            a.extend(b)
        elif f.name == "retry_after_longest_s":
            setattr(into, f.name, max(a, b))
        elif isinstance(a, int | float):
            setattr(into, f.name, a + b)
