"""Runs a set of partitions through the dispatcher: lock, find pending keys, dispatch, report."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

from sqlalchemy.engine import Engine

from backfill_assets.dispatch.batch.mode import batch_lanes
from backfill_assets.dispatch.partition_run import (
    DispatchHalted,
    DispatchJob,
    PartitionRef,
    PartitionReport,
    RegionUnavailable,
    RunOptions,
    RunStopped,
    WorkItem,
)
from backfill_assets.dispatch.routing import RegionRouter, lane_adapters, route_partitions
from backfill_assets.dispatch.sync import DispatchConfig, Dispatcher
from backfill_assets.domain.money.budgets import TenantBudgets
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.domain.policy.validation import warm_up as warm_up_validation
from backfill_assets.domain.work.keys import (
    MAX_LEVEL,
    Versions,
    work_key,
)
from backfill_assets.domain.work.regions import unavailable_message
from backfill_assets.ledger.engine import read_tx, refresh_planner_stats
from backfill_assets.ledger.labels.relabel import relabel
from backfill_assets.ledger.locks.writer_locks import WriterLocks, while_held
from backfill_assets.ledger.policies import contract_lookup, register_policy
from backfill_assets.ledger.run.partition_counts import (
    PartitionCounts,
    held_posts,
    partition_counts,
    post_counts,
)
from backfill_assets.ledger.run.partition_groups import grouped_by_posts, owners_of_all
from backfill_assets.ledger.run.posts import slice_levels
from backfill_assets.ledger.run.tenants import tenant_regions
from backfill_assets.ledger.run.work import (
    PendingPost,
    in_open_batch,
    pending_by_partition,
    tenants_with_open_batches,
)
from backfill_assets.ledger.run.writer import LedgerWriter
from backfill_assets.ledger.spend import limiter_members
from backfill_assets.ledger.spend.budget import StoreBudgetLedger, may_bind
from backfill_assets.providers.models.base import ModelAdapter
from backfill_assets.providers.ratelimit.shared import SHARED_LIMITS

# A member silent this long is taken for dead and its share of the limit goes to the others.
_MEMBER_TTL_S = 5.0


def with_levels(engine: Engine, refs: Sequence[PartitionRef]) -> list[PartitionRef]:
    """The refs with their tenants' slice levels from the store (one query)."""
    with read_tx(engine) as conn:
        levels = slice_levels(conn, {r.tenant_id for r in refs})
    return [r.at_level(levels.get(r.tenant_id, MAX_LEVEL)) for r in refs]


def run_partitions(
    engine: Engine,
    refs: Sequence[PartitionRef],
    make_adapter: Callable[[], ModelAdapter],
    versions: Versions,
    rubric: Rubric,
    run_id: str,
    options: RunOptions,
    log: Callable[[str], None] = lambda _m: None,
    only_posts: Collection[str] | None = None,
    escalated: Mapping[str, Collection[tuple[str, str]]] | None = None,
) -> list[PartitionReport]:
    """Process the partitions' remaining keys; one writer per partition, all in one event loop.

    ``only_posts``: send only these posts' keys (a gold set, a canary sample; sync mode only).
    ``escalated``: per partition key, the (post, text hash) a cascade's earlier stages passed
    on to this stage (``cascade_run.py``); no other post of the partition is sent.

    Each tenant's requests go to its region's lane only. Partitions of a tenant whose region
    has no endpoint here are not dispatched; once the others are done, ``RegionUnavailable``
    names them.
    """
    if versions.key_version != rubric.key_version:
        raise ValueError("the versions name another policy than the rubric sent")
    if only_posts is not None and options.dispatch_mode != "sync":
        raise ValueError("a chosen set of posts is sent in sync mode")
    reports = {r.key: PartitionReport(ref=r) for r in refs}
    # Registered before the first call: the version's labels and rules are on record for
    # whoever checks or applies its results later (policies.py).
    register_policy(engine, rubric.policy)
    warm_up_validation(rubric.contract)  # before the first call, not inside the first flush
    refresh_planner_stats(engine, ("posts", "results", "dead_letters"))
    with read_tx(engine) as conn:
        region_of = tenant_regions(conn, {r.tenant_id for r in refs})
    routing = route_partitions(
        refs, region_of, options.lanes, batch=options.dispatch_mode == "batch"
    )
    for region, keys in routing.unroutable.items():
        log(f"ERROR: not dispatching {len(keys)} partition(s) of region {region!r}: no endpoint")
    with WriterLocks(engine) as locks:
        busy = locks.acquire_many([(r.tenant_id, r.slice) for r in routing.routed])
        owned: list[PartitionRef] = []
        for ref in routing.routed:
            why = busy.get((ref.tenant_id, ref.slice))
            if why is None:
                owned.append(ref)
            else:
                reports[ref.key].busy = True
                log(f"skipping {ref.key}: {why}")
        # A changed mapping re-reads stored answers first, under the partitions' locks.
        for ref in owned:
            again = relabel(engine, ref.tenant_id, ref.slices, versions, rubric)
            reports[ref.key].stats.relabelled = again.changed
            reports[ref.key].stats.relabel_unreadable = again.unreadable
        stopped: Exception | None = None
        job = DispatchJob(engine, locks, versions, rubric, run_id, options, log, escalated)
        if options.dispatch_mode == "batch":
            work = batch_lanes(job, routing, owned, reports)
        else:
            adapters = lane_adapters(routing, make_adapter, options.lanes)
            work = _dispatch(job, owned, reports, adapters, only_posts, escalated)
        try:
            asyncio.run(while_held(locks, work))
        except DispatchHalted as exc:
            stopped = exc
    with read_tx(engine) as conn:
        counts = partition_counts(conn, sorted({r.tenant_id for r in refs}), versions)
    for ref in refs:
        got = _fold(counts, ref)
        reports[ref.key].labels_total = got.labels
        reports[ref.key].rules_total = got.rules
        reports[ref.key].dead_total = got.dead
    done = [reports[r.key] for r in refs]
    if stopped is not None:
        also = f"; {unavailable_message(routing.unroutable)}" if routing.unroutable else ""
        raise RunStopped(f"{stopped}{also}", done) from stopped
    if routing.unroutable:
        raise RegionUnavailable(routing.unroutable, done)
    return done


def _fold(counts: dict[tuple[str, int], PartitionCounts], ref: PartitionRef) -> PartitionCounts:
    """A partition's counts: the sum over the stored slices it holds."""
    out = PartitionCounts()
    for s in ref.slices:
        got = counts.get((ref.tenant_id, s))
        if got is None:
            continue
        for label, n in got.labels.items():
            out.labels[label] = out.labels.get(label, 0) + n
        for rule, n in got.rules.items():
            out.rules[rule] = out.rules.get(rule, 0) + n
        for outcome, n in got.dead.items():
            out.dead[outcome] = out.dead.get(outcome, 0) + n
    return out


def _work(
    engine: Engine,
    refs: Sequence[PartitionRef],
    reports: dict[str, PartitionReport],
    versions: Versions,
    log: Callable[[str], None],
    only_posts: Collection[str] | None = None,
    escalated: Mapping[str, Collection[tuple[str, str]]] | None = None,
) -> Iterator[WorkItem]:
    # Read a group of partitions at a time: memory is bounded by a group (or the largest
    # slice), not the archive, and small tenants' partitions share one query.
    tenants = sorted({r.tenant_id for r in refs})
    with read_tx(engine) as conn:
        sizes = post_counts(conn, tenants)
        batching = tenants_with_open_batches(conn, tenants, versions)
    used = [r for r in refs if r.slices]  # others: too few posts to split this far
    for group in grouped_by_posts(used, sizes):
        owners = owners_of_all(group)
        with read_tx(engine) as conn:
            pending = pending_by_partition(conn, owners, versions)
            waiting = {
                r.key: in_open_batch(conn, r.tenant_id, r.slices, versions)
                for r in group
                if r.tenant_id in batching
            }
        for ref in group:
            todo = pending[ref.key]
            if escalated is not None:
                passed_on = escalated.get(ref.key, ())
                todo = [p for p in todo if (p.post_id, p.content_hash) in passed_on]
            yield from _items(
                ref,
                todo,
                sizes,
                waiting.get(ref.key, 0),
                reports,
                versions,
                log,
                only_posts,
            )


def _items(
    ref: PartitionRef,
    pending: list[PendingPost],
    sizes: Mapping[tuple[str, int], int],
    waiting: int,
    reports: dict[str, PartitionReport],
    versions: Versions,
    log: Callable[[str], None],
    only_posts: Collection[str] | None,
) -> Iterator[WorkItem]:
    """One partition's work items; its report counts posts, pending and waiting keys."""
    if only_posts is not None:
        pending = [p for p in pending if p.post_id in only_posts]
    rep = reports[ref.key]
    rep.posts = held_posts(sizes, ref.tenant_id, ref.slices)
    rep.pending = len(pending)
    rep.in_open_batch = waiting
    if waiting:
        log(f"{ref.key}: {waiting} key(s) wait for an open batch chunk (left to the batch)")
    for p in pending:
        yield WorkItem(
            partition=ref.key,
            tenant_id=ref.tenant_id,
            slice=p.slice,
            post_id=p.post_id,
            content_hash=p.content_hash,
            text=p.text,
            key=work_key(versions, ref.tenant_id, p.post_id, p.content_hash),
            had_dead_letter=p.had_dead_letter,
        )


async def _dispatch(
    job: DispatchJob,
    refs: Sequence[PartitionRef],
    reports: dict[str, PartitionReport],
    make_adapter: Callable[[], ModelAdapter],
    only_posts: Collection[str] | None = None,
    escalated: Mapping[str, Collection[tuple[str, str]]] | None = None,
) -> None:
    engine, options, run_id, log = job.engine, job.options, job.run_id, job.log
    versions, rubric = job.versions, job.rubric
    # The adapter (and any HTTP client) lives and dies with this event loop.
    adapter = make_adapter()
    budgets = TenantBudgets(
        options.budget_tokens,
        StoreBudgetLedger(engine, holder=run_id)
        if may_bind(engine, options.budget_tokens)
        else None,
        chunk_calls=max(4, options.concurrency * 2),
    )
    dispatcher: Dispatcher
    writer = LedgerWriter(
        engine,
        job.fence,
        contract_for=contract_lookup(engine, rubric),
        flush_rows=options.flush_rows,
        flush_interval_s=options.flush_interval_s,
        after_usage=options.after_usage,
        on_flush=lambda rep: dispatcher.on_flush(rep),
    )
    dispatcher = Dispatcher(
        adapter,
        writer,
        budgets,
        DispatchConfig(
            run_id=run_id,
            versions=versions,
            rubric=rubric,
            concurrency=options.concurrency,
            retry=options.retry,
            seed=options.seed,
            log=log,
            ahead=options.ahead,
        ),
    )
    for ref in refs:
        dispatcher.stats[ref.key] = reports[ref.key].stats
    writer.start()
    progress = asyncio.create_task(_progress(dispatcher, log))
    try:
        with _shared_limit(adapter, engine):
            await dispatcher.run(_work(engine, refs, reports, versions, log, only_posts, escalated))
    finally:
        progress.cancel()
        try:
            # A lost lock makes the close raise (nothing more is committed): the budget
            # reservations are released all the same.
            try:
                await writer.close()
            finally:
                await budgets.release()
        finally:
            await adapter.aclose()
            _log_deferred(budgets.deferred, log)


def _log_deferred(deferred: dict[str, str], log: Callable[[str], None], shown: int = 20) -> None:
    for tenant, reason in sorted(deferred.items())[:shown]:
        log(f"{tenant}: keys deferred to a later run: {reason}")
    if len(deferred) > shown:
        log(f"... and {len(deferred) - shown} more tenant(s) with keys deferred by a budget")


@contextlib.contextmanager
def _shared_limit(adapter: ModelAdapter, engine: Engine) -> Iterator[None]:
    """Membership of the account-wide limit for the dispatch (processes share RPM/TPM);
    one per region lane, each with its own limiter and endpoint id."""
    parts = adapter.parts() if isinstance(adapter, RegionRouter) else [adapter]
    with contextlib.ExitStack() as stack:
        for part in parts:
            found = part.rate_limit()
            if found is None:
                continue
            endpoint, limiter = found
            stack.enter_context(
                SHARED_LIMITS.member(
                    limiter,
                    endpoint,
                    beat=lambda e, m, w: limiter_members.heartbeat(
                        engine, e, m, w, ttl_s=_MEMBER_TTL_S
                    ),
                    leave=lambda e, m: limiter_members.leave(engine, e, m),
                )
            )
        yield


async def _progress(dispatcher: Dispatcher, log: Callable[[str], None]) -> None:
    # Visible progress for long runs (budget reservations need no heartbeat:
    # ledger/spend/budget.py).
    while True:
        await asyncio.sleep(10.0)
        done = sum(sum(s.outcomes.values()) for s in dispatcher.stats.values())
        calls = sum(s.calls for s in dispatcher.stats.values())
        log(f"progress: {done} keys finished, {calls} model calls")
