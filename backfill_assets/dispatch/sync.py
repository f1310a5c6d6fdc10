"""The per-key state machine: reserve, announce, call, book, validate, record an outcome.

Workers take keys from one queue; a key waiting on a back-off is parked on a timer, so it
holds no concurrency slot while it sleeps.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from backfill_assets.dispatch.partition_run import DispatchHalted, PartitionStats, WorkItem
from backfill_assets.domain.caps import ERROR_MESSAGE_CHARS, REQUEST_ID_CHARS
from backfill_assets.domain.money.budgets import Reservation, Spend, TenantBudgets, over_bound
from backfill_assets.domain.policy.output_gate import OutputRejected
from backfill_assets.domain.policy.rubric import (
    Rubric,
    estimate_prompt_tokens,
    messages_token_bound,
)
from backfill_assets.domain.work.events import EventKind
from backfill_assets.domain.work.keys import Versions
from backfill_assets.domain.work.outcomes import Outcome, RetryPolicy
from backfill_assets.ledger.run.rows import (
    EventRow,
    KeyRow,
    dead_row,
    event_row,
    key_row,
    result_row,
)
from backfill_assets.ledger.run.writer import FlushReport, LedgerWriter
from backfill_assets.providers.models.base import (
    CapacityUnavailable,
    ModelAdapter,
    ModelCallError,
    ModelRequest,
    ModelResponse,
    NotSent,
    RetriableError,
    RunFatalError,
    TransportRejected,
)


@dataclass
class DispatchConfig:
    """Knobs of one dispatch."""

    run_id: str
    versions: Versions
    rubric: Rubric
    concurrency: int
    retry: RetryPolicy
    seed: int | None = None
    log: Callable[[str], None] = lambda _m: None
    # What a cascade's stages ahead may cost for a post's text (``cascade_run.py``).
    ahead: Callable[[str], Spend] | None = None


class Dispatcher:
    """Runs keys through the model with bounded concurrency and records every step.

    ``concurrency`` workers pull keys straight from the source; a key waiting on a back-off
    sits on a timer, not in a worker, so sleeping never holds a concurrency slot.
    """

    def __init__(
        self,
        adapter: ModelAdapter,
        writer: LedgerWriter,
        budgets: TenantBudgets,
        config: DispatchConfig,
    ) -> None:
        self.adapter = adapter
        self.writer = writer
        self.budgets = budgets
        self.cfg = config
        self.stats: dict[str, PartitionStats] = {}
        self._rng = random.Random(config.seed)
        self._ids = itertools.count(1)
        self._id_prefix = uuid.uuid4().hex[:12]
        self._source: Iterator[WorkItem] = iter(())
        self._source_done = False
        self._ready: collections.deque[tuple[WorkItem, int]] = collections.deque()
        self._sleeping = 0
        self._busy = 0
        self._wake = asyncio.Event()
        # Set by the first run-level error: nothing more is sent, every key left stays pending.
        self.fatal: RunFatalError | None = None
        # Tenants stopped in this run (billed past a reserved bound), with the reason.
        self.stopped_tenants: dict[str, str] = {}
        self._warned_retry_after = False
        # Capacity pauses per key in a row: the back-off grows with them, the attempt does not.
        self._capacity_waits: dict[str, int] = {}

    def stats_for(self, partition: str) -> PartitionStats:
        """Stats of a partition (created on first use)."""
        st = self.stats.get(partition)
        if st is None:
            st = self.stats[partition] = PartitionStats()
        return st

    def on_flush(self, report: FlushReport) -> None:
        """Rows the frame check refused turn from accepted into schema_rejected."""
        for row, _reason in report.rejected:
            st = self.stats_for(row["partition"])
            st.outcomes[Outcome.ACCEPTED] -= 1
            st.labels[row["label"]] -= 1
            st.note_p_label(row["p_label"], -1)
            st.outcomes[Outcome.SCHEMA_REJECTED] += 1

    async def run(self, items: Iterable[WorkItem]) -> None:
        """Process every item to a terminal outcome (or deferral)."""
        self._source = iter(items)
        workers = [
            asyncio.create_task(self._worker(), name=f"dispatch-{i}")
            for i in range(self.cfg.concurrency)
        ]
        try:
            await asyncio.gather(*workers)
        except BaseException:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise
        if self.fatal is not None:
            raise DispatchHalted(f"run stopped: {self.fatal}") from self.fatal

    def _stop(self, exc: RunFatalError) -> None:
        """A run-level error: send nothing more (calls already sent still finish)."""
        if self.fatal is None:
            self.fatal = exc
            self.adapter.halt(f"HTTP {exc.status} from {exc.endpoint}")
            self.cfg.log(f"ERROR: {exc}; stopping the run, keys left stay pending")
        self._wake.set()

    def _next_job(self) -> tuple[WorkItem, int] | None:
        if self.fatal is not None:
            return None
        if self._ready:
            return self._ready.popleft()
        if not self._source_done:
            try:
                return next(self._source), 1
            except StopIteration:
                self._source_done = True
        return None

    async def _worker(self) -> None:
        while True:
            job = self._next_job()
            if job is None:
                if self.fatal is not None or (
                    self._source_done and not self._sleeping and not self._busy
                ):
                    self._wake.set()  # let idle peers see that the work is done
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            self._busy += 1
            try:
                await self._attempt(*job)
            finally:
                self._busy -= 1
            if self._source_done and not self._busy:
                self._wake.set()

    def _requeue_later(self, item: WorkItem, attempt: int, delay: float) -> None:
        self._sleeping += 1

        def due() -> None:
            self._sleeping -= 1
            self._ready.append((item, attempt))
            self._wake.set()

        asyncio.get_running_loop().call_later(delay, due)

    async def _attempt(self, item: WorkItem, attempt: int) -> bool:
        """One attempt; returns True when the key reached a terminal state in this run."""
        st = self.stats_for(item.partition)
        if item.tenant_id in self.stopped_tenants:
            st.outcomes[Outcome.DEFERRED] += 1  # left pending for a later run
            return True
        # The budget reserves what the call can cost at most, whatever the provider's
        # tokenizer; the limiter paces on the cheap estimate and settles to the billed figure.
        rubric = self.cfg.rubric
        messages = rubric.messages(item.key, item.text)
        prompt_bound = messages_token_bound(messages, rubric.extra_bytes)
        out_bound = rubric.max_output_tokens
        bound = prompt_bound + out_bound
        nanos, ahead = None, Spend()  # dollar bounds are worked out only when a budget binds
        if self.budgets.enabled:
            nanos = self.adapter.cost_bound(self.cfg.versions.model, prompt_bound, out_bound)
            ahead = self.cfg.ahead(item.text) if self.cfg.ahead is not None else ahead
        reservation = await self.budgets.reserve(
            item.tenant_id, Spend(bound, nanos or 0) + ahead, priced=nanos is not None
        )
        if reservation is None:
            st.outcomes[Outcome.DEFERRED] += 1
            return True
        reservation = dataclasses.replace(reservation, ahead=ahead)
        attempt_id = f"{self._id_prefix}-{next(self._ids)}"
        await self.writer.record_attempt(self._event(item, attempt, attempt_id, EventKind.ATTEMPT))
        request = ModelRequest(
            key=item.key,
            tenant_id=item.tenant_id,
            post_id=item.post_id,
            attempt=attempt,
            model=self.cfg.versions.model,
            messages=messages,
            max_output_tokens=out_bound,
            estimated_tokens=estimate_prompt_tokens(rubric, item.text) + out_bound,
            contract=rubric.contract,
            bound_tokens=bound,
        )
        st.calls += 1
        started = time.perf_counter()
        try:
            response = await self.adapter.complete(request)
        except ModelCallError as exc:
            return self._failed(item, attempt, attempt_id, exc, reservation, st)
        except Exception as exc:  # an adapter bug must not kill the run; treat as transient
            wrapped = RetriableError(f"adapter error: {type(exc).__name__}")
            return self._failed(item, attempt, attempt_id, wrapped, reservation, st)
        self._capacity_waits.pop(item.key, None)
        st.latencies_ms.append(response.latency_ms or (time.perf_counter() - started) * 1000)
        self._book_usage(item, attempt, attempt_id, response, reservation, st)
        try:
            out, p_label = rubric.read(response.raw_text, item.key, response.logprobs)
        except OutputRejected as exc:
            return self._give_up(item, Outcome.SCHEMA_REJECTED, str(exc), attempt, st)
        stored = rubric.stored(response.raw_text)
        base, part = self._base(item), item.partition
        row = result_row(base, out, part, item.had_dead_letter, p_label, stored)
        self.writer.stage_result(row)
        st.outcomes[Outcome.ACCEPTED] += 1
        st.labels[out.label] += 1
        st.note_p_label(p_label)
        return True

    def _book_usage(
        self,
        item: WorkItem,
        attempt: int,
        attempt_id: str,
        response: ModelResponse,
        reservation: Reservation,
        st: PartitionStats,
    ) -> None:
        """Stage the usage event before the answer is trusted: a malformed answer still cost."""
        cost = response.cost_nanos
        if cost is None:
            cost = self.adapter.cost_of(
                self.cfg.versions.model, response.tokens_in, response.tokens_out
            )
        billed = response.tokens_in + response.tokens_out
        usage = self._event(item, attempt, attempt_id, EventKind.USAGE)
        usage.update(
            {
                "tokens_in": response.tokens_in,
                "tokens_out": response.tokens_out,
                "cost_nanos": cost,
                "tokens_cached": response.tokens_cached,
                "tokens_cache_written": response.tokens_cache_written,
                "tokens_reasoning": response.tokens_reasoning,
                "service_tier": response.service_tier,
                "price_booked": response.price_booked or None,
                "cost_unknown": int(response.cost_unknown),
                "request_id": response.request_id[:REQUEST_ID_CHARS],
                "status": 200,
                "usage_shape": response.usage_shape,
                "bound_tokens": reservation.call_bound.tokens,
            }
        )
        if response.answer_from:
            usage["message"] = f"answer_from: {response.answer_from}"
        if response.usage_shape == "missing":
            usage["message"] = "usage_missing: the provider reported no usage; booked the bound"
            st.usage_missing += 1
        over = over_bound(Spend(billed, cost), reservation)
        if over:
            # Past any byte-level tokenizer's count: the cap can no longer be promised for this
            # tenant, so it gets no more calls in this run. The event records bound and bill.
            usage["message"] = over
            st.over_bound += 1
            if item.tenant_id not in self.stopped_tenants:
                self.stopped_tenants[item.tenant_id] = over
                self.cfg.log(
                    f"ERROR: tenant {item.tenant_id}: provider {over}; "
                    "stopping this tenant (see the spend check and verify)"
                )
        self.writer.stage_event(usage, reservation.reservation_id)
        self.budgets.settle(reservation, Spend(billed, cost))
        st.tokens_in += response.tokens_in
        st.tokens_out += response.tokens_out
        st.tokens_cached += response.tokens_cached
        st.service_tiers[response.service_tier] += 1
        st.calls_cost_unknown += int(response.cost_unknown)
        st.cost_nanos += cost

    def _failed(
        self,
        item: WorkItem,
        attempt: int,
        attempt_id: str,
        exc: ModelCallError,
        reservation: Reservation,
        st: PartitionStats,
    ) -> bool:
        self.budgets.settle(reservation, Spend())
        event = self._event(item, attempt, attempt_id, EventKind.ERROR)
        event.update(
            {
                "status": exc.status,
                "request_id": (exc.request_id or None),
                "message": f"{type(exc).__name__}: {str(exc)[:ERROR_MESSAGE_CHARS]}",
            }
        )
        self.writer.stage_event(event)
        if isinstance(exc, RunFatalError):
            self._stop(exc)
            st.outcomes[Outcome.DEFERRED] += 1  # not the key's fault: it stays pending
            return True
        if isinstance(exc, NotSent):
            st.calls -= 1
            st.outcomes[Outcome.DEFERRED] += 1
            return True
        if isinstance(exc, CapacityUnavailable):
            # The provider's pause, not the key's failure: same attempt number, no dead letter,
            # and a back-off that grows with the pauses so an outage is not hammered.
            st.capacity_waits += 1
            waits = self._capacity_waits[item.key] = self._capacity_waits.get(item.key, 0) + 1
            delay = self.cfg.retry.delay(min(waits, 16), exc.retry_after, self._rng)
            self._requeue_later(item, attempt, delay)
            return False
        self._capacity_waits.pop(item.key, None)
        if exc.status == 429:
            st.rate_limited += 1
        if exc.retry_after is not None:
            st.retry_after_longest_s = max(st.retry_after_longest_s, exc.retry_after)
            if exc.retry_after > self.cfg.retry.retry_after_max_seconds:
                st.retry_after_capped += 1
                if not self._warned_retry_after:
                    self._warned_retry_after = True
                    self.cfg.log(
                        f"provider asked to retry after {exc.retry_after:.0f}s; waiting "
                        f"{self.cfg.retry.retry_after_max_seconds:.0f}s "
                        "(BACKFILL_RETRY_AFTER_MAX_SECONDS)"
                    )
        if isinstance(exc, TransportRejected):
            reason = f"HTTP {exc.status}: {str(exc)[:ERROR_MESSAGE_CHARS]}"
            return self._give_up(item, Outcome.TRANSPORT_REJECTED, reason, attempt, st)
        if self.cfg.retry.exhausted(attempt):
            reason = f"{attempt} attempts; last: {str(exc)[:ERROR_MESSAGE_CHARS]}"
            return self._give_up(item, Outcome.RETRY_EXHAUSTED, reason, attempt, st)
        st.retries += 1
        self._requeue_later(
            item, attempt + 1, self.cfg.retry.delay(attempt, exc.retry_after, self._rng)
        )
        return False

    def _base(self, item: WorkItem) -> KeyRow:
        return key_row(
            self.cfg.versions,
            self.cfg.run_id,
            key=item.key,
            tenant_id=item.tenant_id,
            post_id=item.post_id,
            slice_no=item.slice,
            content_hash=item.content_hash,
        )

    def _event(self, item: WorkItem, attempt: int, attempt_id: str, kind: str) -> EventRow:
        return event_row(
            self.cfg.versions,
            self.cfg.run_id,
            kind,
            key=item.key,
            tenant_id=item.tenant_id,
            slice_no=item.slice,
            attempt_id=attempt_id,
            attempt_no=attempt,
            post_id=item.post_id,
            content_hash=item.content_hash,
        )

    def _give_up(self, item: WorkItem, out: Outcome, why: str, n: int, st: PartitionStats) -> bool:
        """A terminal failure: the key's dead letter, counted; True (the key is done)."""
        self.writer.stage_dead(dead_row(self._base(item), out, why, n))
        st.outcomes[out] += 1
        return True
