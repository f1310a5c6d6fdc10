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
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from backfill_assets.domain.money.budgets import Spend
from backfill_assets.domain.policy.output_gate import OutputContract
from backfill_assets.domain.policy.validation import split_valid
from backfill_assets.domain.work.events import EventKind
from backfill_assets.domain.work.faults import UsageHook
from backfill_assets.domain.work.outcomes import Outcome
from backfill_assets.ledger.bulk import db_time, insert_values, row_values
from backfill_assets.ledger.engine import is_sqlite
from backfill_assets.ledger.locks.fence import Fence, LockLost
from backfill_assets.ledger.run.rows import DeadRow, EventRow, ResultRow, dead_row
from backfill_assets.ledger.run.usage import add_usage
from backfill_assets.ledger.tables import (
    batch_submissions,
    budget_reservations,
    dead_letters,
    ledger_events,
    results,
    tenants,
    utcnow,
)

EVENT_COLUMNS = tuple(c.name for c in ledger_events.c if c.name != "id")
RESULT_COLUMNS = tuple(c.name for c in results.c)
DEAD_COLUMNS = tuple(c.name for c in dead_letters.c)
DEAD_UPSERT = "ON CONFLICT (key) DO UPDATE SET " + ", ".join(
    f"{c} = excluded.{c}" for c in ("outcome", "reason", "attempts", "run_id", "at")
)


@dataclass
class _Staged:
    events: list[EventRow] = field(default_factory=list)
    results: list[ResultRow] = field(default_factory=list)
    dead: list[DeadRow] = field(default_factory=list)
    # reservation id -> billed tokens and nanos to take off it (they now count as spent).
    unreserve: dict[str, Spend] = field(default_factory=lambda: defaultdict(Spend))
    billed: dict[str, Spend] = field(default_factory=lambda: defaultdict(Spend))
    released: dict[str, Spend] = field(default_factory=lambda: defaultdict(Spend))
    # (tenant, model) -> [calls, tokens_in, tokens_out, cost_nanos, tokens_cached,
    # calls_cost_unknown] of the staged usage events.
    usage: dict[tuple[str, str], list[Any]] = field(default_factory=dict)
    first_at: float | None = None

    def empty(self) -> bool:
        return not (self.events or self.results or self.dead)

    def rows(self) -> int:
        return len(self.results) + len(self.dead)


@dataclass
class FlushReport:
    """What one outcome flush made durable; ``rejected`` rows failed the frame check."""

    rejected: list[tuple[ResultRow, str]]


class _Channel:
    """A write connection and a thread of its own to use it from."""

    def __init__(
        self,
        engine: Engine,
        name: str,
        tx_lock: threading.Lock | None,
        relaxed_commit: bool = False,
        fence: Fence | None = None,
    ) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._engine = engine
        self._conn: Connection | None = None
        self._tx_lock = tx_lock
        self._relaxed = relaxed_commit
        self._fence = fence

    def _connection(self) -> Connection:
        if self._conn is None:
            self._conn = self._engine.connect().execution_options(write=True)
            if self._relaxed and not is_sqlite(self._engine):
                # Attempt events only: the server still makes them durable within
                # wal_writer_delay, and our own SIGKILL cannot lose a commit the server has
                # acknowledged; only a server crash could, and it would lose measurement (an
                # orphan-attempt record), never a result or a usage event.
                self._conn.exec_driver_sql("SET synchronous_commit = off")
                self._conn.commit()
        return self._conn

    @contextlib.contextmanager
    def tx(self) -> Iterator[Connection]:
        """A write transaction on the channel's connection (one thread at a time), or the
        fence's: then it commits only while the run's writer locks are held."""
        lock = self._tx_lock or contextlib.nullcontext()
        if self._fence is not None:
            with lock, self._fence.transaction() as fenced:
                yield fenced
            return
        conn = self._connection()
        with lock, conn.begin():
            yield conn

    @contextlib.contextmanager
    def raw_tx(self) -> Iterator[Any]:
        """A write transaction straight on the driver connection (the per-call hot path)."""
        raw = self._connection().connection.driver_connection
        assert raw is not None
        sqlite = is_sqlite(self._engine)
        lock = self._tx_lock or contextlib.nullcontext()
        with lock:
            if sqlite:
                raw.execute("BEGIN IMMEDIATE")
            try:
                yield raw
            except BaseException:
                raw.rollback() if not sqlite else raw.execute("ROLLBACK")
                raise
            if sqlite:
                raw.execute("COMMIT")
            else:
                raw.commit()

    def close(self) -> None:
        """Close the connection and stop the thread."""

        def _close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        self.pool.submit(_close).result()
        self.pool.shutdown(wait=True)


# A flush's billed tokens onto each tenant's total.
_BILL = (
    tenants.update()
    .where(tenants.c.tenant_id == sa.bindparam("b_tenant"))
    .values(
        billed_tokens=tenants.c.billed_tokens + sa.bindparam("b_tokens"),
        billed_nanos=tenants.c.billed_nanos + sa.bindparam("b_nanos"),
    )
)
# PostgreSQL: the tenants' rows locked in sorted order first (ORDER BY sits below the row
# locks), then one UPDATE over arrays. An executemany is a statement a row on the server,
# parsed and planned each: 10,000 of them a run of 10,000 small tenants.
_LOCK_BILLED_PG = sa.text(
    "SELECT tenant_id FROM tenants WHERE tenant_id = ANY(CAST(:tenants AS TEXT[]))"
    " ORDER BY tenant_id FOR UPDATE"
)
_BILL_PG = sa.text(
    "UPDATE tenants SET billed_tokens = tenants.billed_tokens + u.tokens,"
    " billed_nanos = tenants.billed_nanos + u.nanos"
    " FROM unnest(CAST(:tenants AS TEXT[]), CAST(:tokens AS BIGINT[]),"
    " CAST(:nanos AS BIGINT[])) AS u(tenant, tokens, nanos)"
    " WHERE tenants.tenant_id = u.tenant"
)


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
        self._attempt_channel = _Channel(engine, "ledger-attempts", tx_lock, relaxed_commit=True)
        # Results, dead letters and usage commit through the fence (the partitions' writer
        # locks proven held in the same transaction); attempt events announce calls and are not
        # fenced: a writer that lost its locks stops at its next outcome commit.
        self._outcome_channel = _Channel(engine, "ledger-outcomes", tx_lock, fence=fence)
        self._flush_rows = flush_rows
        self._interval = flush_interval_s
        # A crash drill's hook (domain/work/faults.py), called after each outcome commit; else None.
        self._after_usage = after_usage
        self._on_flush = on_flush
        self._attempts: list[EventRow] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._staged = _Staged()
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
            staged, self._staged = self._staged, _Staged()
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

    def _write_outcomes(self, s: _Staged) -> FlushReport:
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
            self._book_spend(conn, s, stamp.date().isoformat())
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
            by_version[str(row["prompt_version"])].append(row)
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

    @staticmethod
    def _book_spend(conn: Connection, s: _Staged, day: str) -> None:
        # Billed tokens move from the reservation to the tenant's total in the same
        # transaction as the usage events, so billed + reserved never drops below real spend;
        # the usage rollup (sql/008) grows by the same events, so it always equals the ledger.
        # Rows are updated in sorted order: two runs flushing for the same tenants (different
        # partitions) in different orders deadlocked on PostgreSQL, failing one run's step.
        if s.usage:
            add_usage(conn, day, sorted(s.usage.items()))
        if s.billed:
            billed = sorted(s.billed.items())  # one entry a tenant: its flush's sum
            if not is_sqlite(conn.engine):
                names = [t for t, _spent in billed]
                conn.execute(_LOCK_BILLED_PG, {"tenants": names})
                conn.execute(
                    _BILL_PG,
                    {
                        "tenants": names,
                        "tokens": [spent.tokens for _t, spent in billed],
                        "nanos": [spent.nanos for _t, spent in billed],
                    },
                )
            else:
                # One executemany, in that order (a statement built each tenant was 7% of a
                # run of 10,000 small tenants).
                conn.execute(
                    _BILL,
                    [
                        {"b_tenant": t, "b_tokens": spent.tokens, "b_nanos": spent.nanos}
                        for t, spent in billed
                    ],
                )
        for rid, spent in sorted(s.unreserve.items()):
            conn.execute(
                budget_reservations.update()
                .where(budget_reservations.c.reservation_id == rid)
                .values(
                    tokens=budget_reservations.c.tokens - spent.tokens,
                    nanos=budget_reservations.c.nanos - spent.nanos,
                    heartbeat_at=utcnow(),
                )
            )
        for chunk_id, bound in sorted(s.released.items()):
            conn.execute(
                batch_submissions.update()
                .where(batch_submissions.c.chunk_id == chunk_id)
                .values(
                    reserved_tokens=batch_submissions.c.reserved_tokens - bound.tokens,
                    reserved_nanos=batch_submissions.c.reserved_nanos - bound.nanos,
                )
            )
