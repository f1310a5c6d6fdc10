"""Batch-mode runs: intent -> upload -> create -> poll -> fetch -> triage -> commit, per chunk.

One coordinator drives every chunk of the run's partitions on one event loop. It re-attaches
the partitions' open chunks first (a batch is never created twice for a chunk), plans new
chunks for the keys still pending, and polls with back-off until each batch ends; retriable
and expired lines come back as pending keys and go into a new chunk (only those).

Polling happens inside the run (docs/providers.md, "Poll inside the run"): the partition's
writer lock is held throughout, so no other process can submit the same keys, and the run ends
only when every key is committed, dead-lettered, deferred or reported.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from backfill_assets.dispatch.batch import attach, cancels, submit
from backfill_assets.dispatch.batch.booking import book, close_unrun
from backfill_assets.dispatch.batch.context import BatchContext, ChunkJob
from backfill_assets.dispatch.batch.pacing import PollPacer, TokenGate
from backfill_assets.dispatch.batch.texts import chunk_echoes, errors_text
from backfill_assets.dispatch.partition_run import PartitionRef, PartitionReport
from backfill_assets.domain.caps import REASON_CHARS
from backfill_assets.domain.work.keys import work_key
from backfill_assets.domain.work.outcomes import Outcome
from backfill_assets.ledger.engine import read_tx
from backfill_assets.ledger.run import submissions as store
from backfill_assets.ledger.run.partition_counts import held_posts, post_counts
from backfill_assets.ledger.run.submissions import ChunkState
from backfill_assets.ledger.run.work import PendingPost, in_open_batch, pending_posts
from backfill_assets.ledger.tables import utcnow
from backfill_assets.providers.batch_client import RateLimited, Refused, Unsure
from backfill_assets.providers.batch_wire import BatchObject
from backfill_assets.providers.models.base import RunFatalError


class BatchRunner:
    """The coordinator of one run's chunks."""

    def __init__(
        self, ctx: BatchContext, refs: Sequence[PartitionRef], reports: dict[str, PartitionReport]
    ) -> None:
        self.ctx = ctx
        self.opts = ctx.options
        self.refs = {r.key: r for r in refs}
        self.reports = reports
        self.jobs: dict[str, ChunkJob] = {}
        self.dirty = set(self.refs)
        self.excluded = ctx.excluded
        self.max_lines = dict.fromkeys(self.refs, self.opts.max_lines)
        self.counted: set[str] = set()
        self.gate = TokenGate(self.opts.poll_seconds, self.opts.max_poll_seconds)
        self.pacer = PollPacer(self.opts.max_poll_seconds)
        # A deadline plan's keys per tenant still to put into chunks (None: every key).
        self.quota = None if self.opts.quota is None else dict(self.opts.quota)
        # Past the switch-over: nothing new is chunked and open batches are cancelled. When
        # each cancel was sent (monotonic), and the chunks whose cancel overran the plan.
        self.switched = False
        self.cancel_sent: dict[str, float] = {}
        self.overrun: set[str] = set()

    async def run(self) -> None:
        """Until every chunk of the run's partitions has ended (with ``submit_only``: until
        every chunk is at the provider)."""
        await self._resume_open()
        while True:
            self._check_fatal()
            await self._switch_over()
            await self._plan()
            await self._push()
            if not self.jobs:
                return
            if self.opts.submit_only and not any(
                j.state in (ChunkState.INTENT, ChunkState.UPLOADED) for j in self.jobs.values()
            ):
                return
            await self._poll()
            self._check_fatal()
            await self._idle()

    def _check_fatal(self) -> None:
        if self.ctx.fatal is not None:
            raise self.ctx.fatal

    def _open(self, ref: PartitionRef) -> list[tuple[store.Submission, list[store.LineRow]]]:
        with read_tx(self.ctx.engine) as conn:
            subs = store.open_submissions(conn, ref.tenant_id, ref.slices)
            return [(s, store.chunk_lines(conn, s.chunk_id)) for s in subs]

    async def _resume_open(self) -> None:
        ctx = self.ctx
        for ref in self.refs.values():
            for sub, lines in await ctx.db(self._open, ref):
                # Its reservation is its row (reserved_tokens), held since its intent.
                job = ChunkJob(sub, lines, ref.key, interval=self.opts.poll_seconds)
                self.jobs[sub.chunk_id] = job
                self._take(ref.tenant_id, sub.lines)
                ctx.log(
                    f"chunk {sub.chunk_id} ({ref.key}, {sub.lines} lines): resuming at "
                    f"'{sub.state}'" + (f", batch {sub.batch_id}" if sub.batch_id else "")
                )
                if sub.state == ChunkState.UPLOADED:
                    # The process may have died between create and storing the batch id.
                    await attach.reattach(ctx, job)
                if sub.state == ChunkState.ENDED:
                    self._ended(job, await book(ctx, job))

    def _pending(self, ref: PartitionRef) -> tuple[int, int, list[PendingPost]]:
        versions = self.ctx.versions
        with read_tx(self.ctx.engine) as conn:
            sizes = post_counts(conn, [ref.tenant_id])
            size = held_posts(sizes, ref.tenant_id, ref.slices)
            waiting = in_open_batch(conn, ref.tenant_id, ref.slices, versions)
            pending = pending_posts(conn, ref.tenant_id, ref.slices, versions)
        if self.ctx.passed_on is not None:
            passed_on = self.ctx.passed_on.get(ref.key, ())
            pending = [p for p in pending if (p.post_id, p.content_hash) in passed_on]
        return size, waiting, pending

    async def _plan(self) -> None:
        ctx = self.ctx
        for key in sorted(self.dirty):
            ref = self.refs[key]
            size, waiting, pending = await ctx.db(self._pending, ref)
            if key not in self.counted:
                self.counted.add(key)
                rep = self.reports[key]
                rep.posts, rep.pending, rep.in_open_batch = size, len(pending), waiting
            busy = {ln.key for j in self.jobs.values() if j.partition == key for ln in j.lines}
            skip = busy | self.excluded[key]
            todo = [
                p
                for p in pending
                if work_key(ctx.versions, ref.tenant_id, p.post_id, p.content_hash) not in skip
            ]
            if self.switched:
                continue  # returned keys are left to the synchronous tiers
            if self.quota is not None:
                todo = todo[: max(0, self.quota.get(ref.tenant_id, 0))]
                self._take(ref.tenant_id, len(todo))
            if not todo:
                continue
            if ref.tenant_id in ctx.stopped_tenants:
                # Billed past a bound: nothing new is sent for this tenant in this run.
                ctx.stats_for(key).outcomes[Outcome.DEFERRED] += len(todo)
                self.excluded[key].update(
                    work_key(ctx.versions, ref.tenant_id, p.post_id, p.content_hash) for p in todo
                )
                continue
            # A chunk holds one stored slice (a partition of a small tenant holds several):
            # its rows carry the posts' own slice, as in sync mode.
            for slice_no in sorted({p.slice for p in todo}):
                group = [p for p in todo if p.slice == slice_no]
                await self._chunk(key, ref, slice_no, group)
        self.dirty.clear()

    def _take(self, tenant: str, keys: int) -> None:
        if self.quota is not None:
            self.quota[tenant] = self.quota.get(tenant, 0) - keys

    async def _switch_over(self) -> None:
        """At the deadline plan's switch-over, every open chunk is closed or cancelled."""
        at = self.opts.switch_at
        if at is None or time.time() < at:
            return
        if not self.switched:
            self.switched = True
            self.ctx.log(f"switch-over: cancelling {len(self.jobs)} open chunk(s)")
        await cancels.switch_over(self.ctx, self.jobs, self.cancel_sent, self.opts.poll_seconds)

    async def _chunk(
        self, key: str, ref: PartitionRef, slice_no: int, todo: list[PendingPost]
    ) -> None:
        ctx = self.ctx
        jobs, deferred = await submit.plan(
            ctx, key, ref.tenant_id, slice_no, todo, self.max_lines[key]
        )
        for job in jobs:
            job.interval = self.opts.poll_seconds
            self.jobs[job.sub.chunk_id] = job
            ctx.log(f"chunk {job.sub.chunk_id} ({key}): {job.sub.lines} lines planned")
        if deferred:
            ctx.stats_for(key).outcomes[Outcome.DEFERRED] += len(deferred)
            self.excluded[key].update(deferred)
            ctx.log(f"{key}: {len(deferred)} key(s) deferred (tenant budget)")

    async def _push(self) -> None:
        """Upload recorded chunks and create their batches while the token gate is open."""
        ctx = self.ctx
        for job in list(self.jobs.values()):
            if job.sub.tenant_id in ctx.stopped_tenants and await self._hold_back(job):
                continue
            try:
                if job.state == ChunkState.INTENT:
                    await submit.upload(ctx, job)
                now = time.monotonic()
                if (
                    job.state != ChunkState.UPLOADED
                    or (self.switched and job.sub.create_sent_at is None)
                    or not self.gate.is_open(now)
                    or now < job.retry_at
                ):
                    continue
                why = await attach.create(ctx, job)
            except Refused as exc:
                await self._fail(
                    job,
                    f"refused: {exc}",
                    ChunkState.ABANDONED if exc.code == "stale" else ChunkState.FAILED,
                )
                continue
            if why is attach.Wait.TOKEN_LIMIT:
                # Refused at create: each refusal after a wait is fresh news, so back off.
                self._close_gate(job, again=self.gate.refusals > 0)
            elif why is None:
                job.next_poll = time.monotonic() + job.interval
                ctx.log(f"chunk {job.sub.chunk_id}: batch {job.sub.batch_id} submitted")

    async def _hold_back(self, job: ChunkJob) -> bool:
        """A stopped tenant's chunk not sent yet is closed unrun (its keys wait for a later
        run); True if it was. One whose create may have happened is still looked up."""
        if (
            job.state not in (ChunkState.INTENT, ChunkState.UPLOADED)
            or job.sub.create_sent_at is not None
        ):
            return False
        reason = self.ctx.stopped_tenants[job.sub.tenant_id]
        await close_unrun(
            self.ctx, job, f"tenant stopped in this run ({reason})", ChunkState.REQUEUED
        )
        self.jobs.pop(job.sub.chunk_id, None)
        self.ctx.stats_for(job.partition).outcomes[Outcome.DEFERRED] += job.sub.lines
        self.excluded[job.partition].update(ln.key for ln in job.lines)
        return True

    async def _poll(self) -> None:
        due = sorted(
            (j for j in self.jobs.values() if j.state == ChunkState.SUBMITTED),
            key=lambda j: j.next_poll,
        )
        for job in due:
            now = time.monotonic()
            if job.next_poll > now or now < self.pacer.paused_until:
                break
            if self.pacer.gap_s:
                await asyncio.sleep(self.pacer.gap_s)
            assert job.sub.batch_id is not None
            try:
                batch = await self.ctx.client.retrieve(job.sub.batch_id)
            except RateLimited as exc:
                self._poll_limited(job, exc)
                break
            except Unsure as exc:
                self.ctx.log(f"batch {job.sub.batch_id}: status unknown ({exc}); asking later")
                job.next_poll = time.monotonic() + job.interval
                continue
            except Refused as exc:
                # Refusing a status call says nothing of the batch, which may still run and
                # bill: stop the run, the chunk stays 'submitted' and the next run re-attaches.
                raise RunFatalError(
                    f"status of batch {job.sub.batch_id} refused: {exc}",
                    status=exc.status,
                    endpoint=f"GET /batches/{job.sub.batch_id}",
                ) from None
            self.pacer.answered()
            await self._observe(job, batch)

    def _poll_limited(self, job: ChunkJob, exc: RateLimited) -> None:
        # A 429 says nothing about the batch: keep its state, slow every poll down.
        pause = self.pacer.rate_limited(time.monotonic(), exc.retry_after)
        self.ctx.stats_for(job.partition).rate_limited += 1
        self.ctx.log(f"status polls rate-limited (429): pausing {pause:.2f}s")

    async def _observe(self, job: ChunkJob, batch: BatchObject) -> None:
        ctx, sub = self.ctx, job.sub
        counts = batch.request_counts
        seen = (batch.status, counts.completed, counts.failed)
        values = {
            "provider_status": batch.status,
            "requests_total": counts.total,
            "requests_completed": counts.completed,
            "requests_failed": counts.failed,
        }
        if batch.terminal:
            echoes = await ctx.db(chunk_echoes, ctx, job) if batch.errors else ()
            await ctx.db(
                store.update,
                ctx.fence,
                sub,
                state=ChunkState.ENDED,
                output_file_id=batch.output_file_id,
                error_file_id=batch.error_file_id,
                errors=errors_text(batch, [ctx.secret] if ctx.secret else [], echoes),
                finished_at=utcnow(),
                **values,
            )
            ctx.log(
                f"batch {sub.batch_id} ({job.partition}): {batch.status}, "
                f"{counts.completed}/{counts.total} done, {counts.failed} failed"
            )
            await cancels.note_ended(ctx, job, batch, self.cancel_sent.get(sub.chunk_id))
            self._ended(job, await book(ctx, job))
            return
        asked = self.cancel_sent.get(sub.chunk_id)
        if asked is not None and sub.chunk_id not in self.overrun:
            late = cancels.overrun_message(job, asked, self.opts.cancel_s, time.monotonic())
            if late:
                self.overrun.add(sub.chunk_id)
                ctx.log(late)
        if sub.chunk_id not in self.cancel_sent:
            # A cancel's end is what a deadline waits for: its polls do not back off.
            job.interval = min(job.interval * 1.5, self.opts.max_poll_seconds)
        job.next_poll = time.monotonic() + job.interval
        if seen != job.last_seen:
            job.last_seen = seen
            await ctx.db(store.update, ctx.fence, sub, **values)
            ctx.log(
                f"batch {sub.batch_id} ({job.partition}): {batch.status}, "
                f"{counts.completed}/{counts.total} done, {counts.failed} failed; "
                f"next poll in {job.interval:.1f}s"
            )
        ctx.reached("poll")

    def _ended(self, job: ChunkJob, ending: ChunkState) -> None:
        self.jobs.pop(job.sub.chunk_id, None)
        self.dirty.add(job.partition)  # retriable, expired or requeued keys are pending again
        if ending is ChunkState.BOOKED:
            # A batch left the queue: capacity under the enqueued-token limit is back.
            self.gate.reopen()
        elif ending is ChunkState.REQUEUED:
            self._close_gate(job)
        else:
            self.excluded[job.partition].update(ln.key for ln in job.lines)
            self.ctx.log(
                f"ERROR: batch {job.sub.batch_id} ({job.partition}) failed validation; its "
                f"{job.sub.lines} keys stay pending. Errors: {job.sub.errors}"
            )

    def _close_gate(self, job: ChunkJob, again: bool = False) -> None:
        """The enqueued-token limit: no new batch until one of ours ends or the wait is over."""
        now = time.monotonic()
        others = any(j.state == ChunkState.SUBMITTED for j in self.jobs.values())
        # The same keys refused again (seq > 1, or a create refused again), or refused with
        # nothing of ours queued: back off further and make the partition's chunks smaller
        # (one alone may exceed the limit).
        again = again or job.sub.seq > 1
        if again or not others:
            self.max_lines[job.partition] = max(1, job.sub.lines // 2)
        wait = self.gate.refused(now, again)
        self.ctx.log(
            f"chunk {job.sub.chunk_id}: enqueued-token limit reached; waiting "
            f"{wait:.2f}s{' for earlier batches' if others else ''}"
        )

    async def _fail(self, job: ChunkJob, message: str, state: ChunkState) -> None:
        await close_unrun(self.ctx, job, message, state)
        await self.ctx.db(store.update, self.ctx.fence, job.sub, errors=message[:REASON_CHARS])
        self.jobs.pop(job.sub.chunk_id, None)
        self.excluded[job.partition].update(ln.key for ln in job.lines)
        self.ctx.log(f"ERROR: chunk {job.sub.chunk_id} ({job.partition}) {state}: {message}")

    async def _idle(self) -> None:
        now = time.monotonic()
        wake: list[float] = []
        for job in self.jobs.values():
            if job.state == ChunkState.SUBMITTED:
                wake.append(max(job.next_poll, self.pacer.paused_until))
            elif job.state == ChunkState.UPLOADED:
                wake.append(max(self.gate.until, job.retry_at))
            else:
                wake.append(now)
        at = self.opts.switch_at
        if at is not None and not self.switched and wake:
            wake.append(now + max(0.0, at - time.time()))
        await asyncio.sleep(max(0.0, min(wake, default=now) - now))
