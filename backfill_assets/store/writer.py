"""Group-committing writer for ledger events, results and dead letters.

Two lanes share one transaction stream:
- attempts are committed before the call they announce (callers await durability);
- usage/error events, results and dead letters are staged and committed together, at most
  ``flush_interval_s`` after the first one was staged, so a key's usage and its outcome become
  durable in the same transaction and the crash window is "calls in flight plus one flush".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection, Engine

from ..validation import split_valid
from .dialect import insert_for
from .engine import write_tx
from .tables import budget_reservations, dead_letters, ledger_events, results, tenants, utcnow

Row = dict[str, Any]


@dataclass
class _Staged:
    events: list[Row] = field(default_factory=list)
    results: list[Row] = field(default_factory=list)
    dead: list[Row] = field(default_factory=list)
    settle: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    billed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    first_at: float | None = None

    def empty(self) -> bool:
        return not (self.events or self.results or self.dead)


@dataclass
class FlushReport:
    """What one flush made durable; ``rejected`` rows failed the frame check."""

    usage_events: int
    accepted: list[Row]
    rejected: list[tuple[Row, str]]


class LedgerWriter:
    """Owns one connection in one thread; the event loop never blocks on the database."""

    def __init__(
        self,
        engine: Engine,
        *,
        flush_rows: int = 256,
        flush_interval_s: float = 0.05,
        kill_after_usage: int | None = None,
        on_flush: Callable[[FlushReport], None] | None = None,
    ) -> None:
        self._engine = engine
        self._flush_rows = flush_rows
        self._interval = flush_interval_s
        self._kill_after = kill_after_usage if kill_after_usage and kill_after_usage > 0 else None
        self._on_flush = on_flush
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-writer")
        self._attempts: list[Row] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._staged = _Staged()
        self._wake = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self.usage_committed = 0
        self.flushes = 0

    def start(self) -> None:
        """Start the flush loop on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="ledger-writer")

    async def record_attempt(self, row: Row) -> None:
        """Write an attempt event and return once it is committed."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._attempts.append(row)
        self._waiters.append(fut)
        self._wake.set()
        await fut

    def stage_event(self, row: Row, reservation_id: str | None = None) -> None:
        """Stage a usage or error event (booked with the outcome that follows it)."""
        self._staged.events.append(row)
        tokens = int(row["tokens_in"]) + int(row["tokens_out"])
        if row["type"] == "usage" and tokens:
            self._staged.billed[row["tenant_id"]] += tokens
            if reservation_id is not None:
                self._staged.settle[reservation_id] += tokens
        self._mark()

    def stage_result(self, row: Row) -> None:
        """Stage an accepted result (validated again as a frame before commit)."""
        self._staged.results.append(row)
        self._mark()

    def stage_dead(self, row: Row) -> None:
        """Stage a dead letter (replaces any earlier one for the key)."""
        self._staged.dead.append(row)
        self._mark()

    def _mark(self) -> None:
        if self._staged.first_at is None:
            self._staged.first_at = time.monotonic()
            self._wake.set()
        if len(self._staged.results) + len(self._staged.dead) >= self._flush_rows:
            self._wake.set()

    async def close(self) -> None:
        """Flush everything and stop."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        self._pool.shutdown(wait=True)

    def _staged_due(self) -> bool:
        s = self._staged
        if s.empty():
            return False
        if self._closing or len(s.results) + len(s.dead) >= self._flush_rows:
            return True
        return s.first_at is not None and time.monotonic() - s.first_at >= self._interval

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._attempts and not self._staged_due():
                if self._closing and self._staged.empty():
                    return
                timeout = None
                if self._staged.first_at is not None:
                    timeout = max(0.0, self._interval - (time.monotonic() - self._staged.first_at))
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            attempts, waiters = self._attempts, self._waiters
            self._attempts, self._waiters = [], []
            staged = None
            if self._staged_due():
                staged, self._staged = self._staged, _Staged()
            try:
                report = await loop.run_in_executor(self._pool, self._flush, attempts, staged)
            except BaseException as exc:
                for w in waiters:
                    if not w.done():
                        w.set_exception(exc)
                raise
            for w in waiters:
                if not w.done():
                    w.set_result(None)
            if report is not None and self._on_flush is not None:
                self._on_flush(report)

    def _flush(self, attempts: list[Row], staged: _Staged | None) -> FlushReport | None:
        report = None
        with write_tx(self._engine) as conn:
            if attempts:
                conn.execute(ledger_events.insert(), attempts)
            if staged is not None:
                report = self._write_staged(conn, staged)
        self.flushes += 1
        if report is not None:
            self.usage_committed += report.usage_events
            if self._kill_after is not None and self.usage_committed >= self._kill_after:
                # Fault injection (BACKFILL_KILL_AFTER_USAGE): die the hard way, right after
                # the Nth usage event became durable, to prove resume never loses or re-pays.
                os.kill(os.getpid(), signal.SIGKILL)
        return report

    def _write_staged(self, conn: Connection, s: _Staged) -> FlushReport:
        good, bad = split_valid(s.results)
        dead = list(s.dead)
        now = utcnow()
        for row, reason in bad:
            dead.append(_as_dead(row, reason, now))
        if s.events:
            conn.execute(ledger_events.insert(), s.events)
        if good:
            conn.execute(
                insert_for(conn, results).on_conflict_do_nothing(),
                [{k: v for k, v in r.items() if k in results.c} for r in good],
            )
            conn.execute(
                dead_letters.delete().where(dead_letters.c.key.in_([r["key"] for r in good]))
            )
        if dead:
            stmt = insert_for(conn, dead_letters)
            stmt = stmt.on_conflict_do_update(
                index_elements=["key"],
                set_={
                    c: stmt.excluded[c] for c in ("outcome", "reason", "attempts", "run_id", "at")
                },
            )
            conn.execute(stmt, _last_per_key(dead))
        for tenant_id, tokens in s.billed.items():
            conn.execute(
                tenants.update()
                .where(tenants.c.tenant_id == tenant_id)
                .values(billed_tokens=tenants.c.billed_tokens + tokens)
            )
        for rid, tokens in s.settle.items():
            conn.execute(
                budget_reservations.update()
                .where(budget_reservations.c.reservation_id == rid)
                .values(tokens=budget_reservations.c.tokens - tokens, heartbeat_at=now)
            )
        usage = sum(1 for e in s.events if e["type"] == "usage")
        return FlushReport(usage_events=usage, accepted=good, rejected=bad)


def _as_dead(row: Row, reason: str, now: Any) -> Row:
    return {
        "key": row["key"],
        "tenant_id": row["tenant_id"],
        "post_id": row["post_id"],
        "slice": row["slice"],
        "content_hash": row["content_hash"],
        "model": row["model"],
        "prompt_version": row["prompt_version"],
        "task_version": row["task_version"],
        "outcome": "schema_rejected",
        "reason": reason[:500],
        "attempts": int(row.get("attempts", 1)),
        "run_id": row["run_id"],
        "at": now,
    }


def _last_per_key(rows: list[Row]) -> list[Row]:
    latest: dict[str, Row] = {}
    for r in rows:
        latest[r["key"]] = r
    return [{k: v for k, v in r.items() if k in dead_letters.c} for r in latest.values()]
