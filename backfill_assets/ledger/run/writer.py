"""Group-committing writer for ledger events, results and dead letters.

Two channels, each with its own connection:
- the attempt channel commits attempt events before the calls they announce (callers await it);
- the outcome channel stages usage/error events, results and dead letters and commits them
  together, at most ``flush_interval_s`` after the first was staged, so a key's usage and its
  outcome become durable in one transaction; a crash loses at most the calls in flight plus
  one flush, and those show up as attempts without usage ("orphan attempts").
The frame check (pandera) runs before the outcome transaction opens, so the write lock (which
attempt commits wait for on SQLite) is never held while it runs. On PostgreSQL outcome
flushes run on the channel's own thread, which overlaps the server's WAL flush at commit with the
calls; on SQLite (no fsync at commit in WAL mode with synchronous=NORMAL) a flush is all CPU,
and running it on the event loop avoids the two threads trading the GIL and the write lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from backfill_assets.domain.money.budgets import Spend
from backfill_assets.domain.policy.output_gate import OutputContract
from backfill_assets.domain.policy.validation import split_valid
from backfill_assets.domain.work.events import EventKind
from backfill_assets.domain.work.faults import UsageHook
from backfill_assets.domain.work.outcomes import Outcome
from backfill_assets.ledger.bulk import db_time, insert_values, row_values
from backfill_assets.ledger.engine import is_sqlite
from backfill_assets.ledger.locks.fence import Fence, LockLost
from backfill_assets.ledger.run.booking import Staged, book_spend
from backfill_assets.ledger.run.rows import DeadRow, EventRow, ResultRow, dead_row
from backfill_assets.ledger.tables import (
    dead_letters,
    ledger_events,
    results,
    utcnow,
)
from backfill_assets.ledger.write_channel import WriteChannel

EVENT_COLUMNS = tuple(c.name for c in ledger_events.c if c.name != "id")
RESULT_COLUMNS = tuple(c.name for c in results.c)
DEAD_COLUMNS = tuple(c.name for c in dead_letters.c)
DEAD_UPSERT = "ON CONFLICT (key) DO UPDATE SET " + ", ".join(
    f"{c} = excluded.{c}" for c in ("outcome", "reason", "attempts", "run_id", "at")
)


@dataclass
class FlushReport:
    """What one outcome flush made durable; ``rejected`` rows failed the frame check."""

    rejected: list[tuple[ResultRow, str]]


class LedgerWriter:
    """Durable bookkeeping for the dispatcher.

    Attempt commits are small and run on the event loop, since a thread hop costs more than
    they do; outcome flushes (validation, bulk inserts) too on SQLite, on their channel's thread
    on PostgreSQL.
    """

    def __init__(
        self,
        engine: Engine,
        fence: Fence | None = None,
        *,
        contract_for: Callable[[str], OutputContract | None],
        flush_rows: int = 2048,
        flush_interval_s: float = 0.1,
        after_usage: UsageHook | None = None,
        on_flush: Callable[[FlushReport], None] | None = None,
    ) -> None:
        # ``contract_for``: a result row's prompt version -> the output contract of its policy
        # (the frame check's labels and rules); None fails the row (no policy, no label).
        self._contract_for = contract_for
        # SQLite has one write lock per database: hand it over in-process with a Python lock
        # instead of SQLite's sleeping busy handler.
        tx_lock = threading.Lock() if is_sqlite(engine) else None
        self._flush_on_loop = is_sqlite(engine)  # see the module docstring
        self._dialect = engine.dialect.name
        self._attempt_channel = WriteChannel(
            engine, "ledger-attempts", tx_lock, relaxed_commit=True
        )
        # Results, dead letters and usage commit through the fence (the partitions' writer
        # locks proven held in the same transaction); attempt events announce calls and are not
        # fenced: a writer that lost its locks stops at its next outcome commit.
        self._outcome_channel = WriteChannel(engine, "ledger-outcomes", tx_lock, fence=fence)
        self._flush_rows = flush_rows
        self._interval = flush_interval_s
        # A crash drill's hook (domain/work/faults.py), called after each outcome commit; else None.
        self._after_usage = after_usage
        self._on_flush = on_flush
        self._attempts: list[EventRow] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._staged = Staged()
        self._attempt_wake = asyncio.Event()
        self._outcome_wake = asyncio.Event()
        self._closing = False
        self._failure: BaseException | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.usage_committed = 0

    def start(self) -> None:
        """Start both flush loops on the running event loop."""
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._attempt_loop(), name="ledger-attempts"),
            loop.create_task(self._outcome_loop(), name="ledger-outcomes"),
        ]

    async def record_attempt(self, row: EventRow) -> None:
        """Write an attempt event and return once it is committed."""
        if self._failure is not None:
            # The outcome channel is down: no new call may start whose result could not be kept.
            if isinstance(self._failure, LockLost):
                raise LockLost(str(self._failure)) from self._failure
            raise RuntimeError("ledger writer failed") from self._failure
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._attempts.append(row)
        self._waiters.append(fut)
        self._attempt_wake.set()
        await fut

    def stage_event(
        self,
        row: EventRow,
        reservation_id: str | None = None,
        chunk: tuple[str, Spend] | None = None,
    ) -> None:
        """Stage a usage or error event (booked with the outcome that follows it).

        ``chunk`` (batch mode): ``(chunk_id, bound)``, the line's bound leaves its open chunk's
        reservation in the same transaction as the event.
        """
        self._staged.events.append(row)
        if chunk is not None and chunk[1] != Spend():
            self._staged.released[chunk[0]] += chunk[1]
        tokens_in, tokens_out = int(row["tokens_in"]), int(row["tokens_out"])
        if row["type"] == EventKind.USAGE:
            sums = self._staged.usage.get((row["tenant_id"], row["model"]))
            if sums is None:
                sums = self._staged.usage[(row["tenant_id"], row["model"])] = [0, 0, 0, 0, 0, 0]
            sums[0] += 1
            sums[1] += tokens_in
            sums[2] += tokens_out
            sums[3] += int(row["cost_nanos"])
            sums[4] += int(row.get("tokens_cached") or 0)
            sums[5] += int(row.get("cost_unknown") or 0)
            spent = Spend(tokens_in + tokens_out, int(row["cost_nanos"]))
            if spent != Spend():
                self._staged.billed[row["tenant_id"]] += spent
                if reservation_id is not None:
                    self._staged.unreserve[reservation_id] += spent
        self._mark()

    def stage_result(self, row: ResultRow) -> None:
        """Stage an accepted result (validated again as a frame before commit)."""
        self._staged.results.append(row)
        self._mark()

    def stage_dead(self, row: DeadRow) -> None:
        """Stage a dead letter (replaces any earlier one for the key)."""
        self._staged.dead.append(row)
        self._mark()

    def _mark(self) -> None:
        if self._staged.first_at is None:
            self._staged.first_at = time.monotonic()
            self._outcome_wake.set()
        elif self._staged.rows() >= self._flush_rows:
            self._outcome_wake.set()

    async def close(self) -> None:
        """Flush everything and stop."""
        self._closing = True
        self._attempt_wake.set()
        self._outcome_wake.set()
        try:
            await asyncio.gather(*self._tasks)
        finally:
            await asyncio.to_thread(self._attempt_channel.close)
            await asyncio.to_thread(self._outcome_channel.close)

    async def _attempt_loop(self) -> None:
        while True:
            if not self._attempts:
                if self._closing:
                    return
                self._attempt_wake.clear()
                await self._attempt_wake.wait()
                continue
            rows, waiters = self._attempts, self._waiters
            self._attempts, self._waiters = [], []
            try:
                # A small local commit (SQLite, or PostgreSQL without waiting for the WAL
                # flush) costs less on the loop than a hop to the channel's thread and back.
                self._write_attempts(rows)
            except BaseException as exc:
                for w in waiters:
                    if not w.done():
                        w.set_exception(exc)
                raise
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    def _staged_due(self) -> bool:
        s = self._staged
        if s.empty():
            return False
        if self._closing or s.rows() >= self._flush_rows:
            return True
        return s.first_at is not None and time.monotonic() - s.first_at >= self._interval

    async def _outcome_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._staged_due():
                if self._closing and self._staged.empty() and not self._attempts:
                    return
                timeout = None
                if self._staged.first_at is not None:
                    timeout = max(0.0, self._interval - (time.monotonic() - self._staged.first_at))
                elif self._closing:
                    timeout = 0.01
                self._outcome_wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._outcome_wake.wait(), timeout)
                continue
            staged, self._staged = self._staged, Staged()
            try:
                if self._flush_on_loop:
                    report = self._write_outcomes(staged)
                else:
                    report = await loop.run_in_executor(
                        self._outcome_channel.pool, self._write_outcomes, staged
                    )
            except BaseException as exc:
                self._failure = exc
                raise
            if self._on_flush is not None:
                self._on_flush(report)

    def _write_attempts(self, rows: list[EventRow]) -> None:
        # Parameters are built before the write lock: the other channel waits only for the insert.
        now = db_time(self._dialect, utcnow())
        for row in rows:
            row["at"] = now
        values = row_values(ledger_events, EVENT_COLUMNS, rows)
        with self._attempt_channel.raw_tx() as raw:
            insert_values(raw, ledger_events, EVENT_COLUMNS, values)

    def _write_outcomes(self, s: Staged) -> FlushReport:
        # Validate and build every parameter outside the transaction: the write lock (which
        # the attempt commits on the event loop wait for) is held only for the inserts.
        good, bad = self._frame_check(s.results)
        dead = list(s.dead) + [
            dead_row(row, Outcome.SCHEMA_REJECTED, reason, 1) for row, reason in bad
        ]
        stamp = utcnow()
        now = db_time(self._dialect, stamp)
        for event in s.events:
            event["at"] = now
        event_values = row_values(ledger_events, EVENT_COLUMNS, s.events)
        for result in good:
            result["created_at"] = now
        result_values = row_values(results, RESULT_COLUMNS, good)
        cleared = [r["key"] for r in good if r["had_dead_letter"]]
        latest = list({r["key"]: r for r in dead}.values())
        for letter in latest:
            letter["at"] = now
        dead_values = row_values(dead_letters, DEAD_COLUMNS, latest)
        with self._outcome_channel.tx() as conn:
            insert_values(conn, ledger_events, EVENT_COLUMNS, event_values)
            insert_values(conn, results, RESULT_COLUMNS, result_values, "ON CONFLICT DO NOTHING")
            if cleared:
                conn.execute(dead_letters.delete().where(dead_letters.c.key.in_(cleared)))
            insert_values(conn, dead_letters, DEAD_COLUMNS, dead_values, DEAD_UPSERT)
            book_spend(conn, s, stamp.date().isoformat())
        self.usage_committed += sum(sums[0] for sums in s.usage.values())
        if self._after_usage is not None:
            self._after_usage(self.usage_committed)
        return FlushReport(rejected=bad)

    def _frame_check(
        self, rows: list[ResultRow]
    ) -> tuple[list[ResultRow], list[tuple[ResultRow, str]]]:
        """Each policy version's rows against its own contract (one frame per version)."""
        by_version: dict[str, list[ResultRow]] = defaultdict(list)
        for row in rows:
            by_version[str(row["key_version"])].append(row)
        good: list[ResultRow] = []
        bad: list[tuple[ResultRow, str]] = []
        for version, group in by_version.items():
            contract = self._contract_for(version)
            if contract is None:
                bad += [(r, "result frame: no policy for its version") for r in group]
                continue
            ok, failed = split_valid(group, contract)
            good += ok
            bad += failed
        return good, bad
