"""The Batch API submission ledger: chunks, their lines, and every step's ids and times.

Blocking SQL; the batch runner calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.domain.money.budgets import Spend
from backfill_assets.domain.work.events import EventKind
from backfill_assets.ledger.bulk import db_time, insert_rows
from backfill_assets.ledger.locks.fence import Fence
from backfill_assets.ledger.run.writer import EVENT_COLUMNS
from backfill_assets.ledger.tables import (
    batch_lines,
    batch_submissions,
    ledger_events,
    posts,
    utcnow,
)


class ChunkState(enum.StrEnum):
    """Where a chunk is (``batch_submissions.state``, the CHECK list of ``sql/003``)."""

    INTENT = "intent"  # row and lines written; nothing sent yet
    UPLOADED = "uploaded"  # the input file is at the provider
    SUBMITTED = "submitted"  # the batch exists at the provider
    ENDED = "ended"  # the batch reached a terminal status; its lines are not booked yet
    BOOKED = "booked"  # its lines are booked: results, dead letters, usage (sql/019)
    FAILED = "failed"  # the provider refused the batch (validation): reported, keys kept
    REQUEUED = "requeued"  # never ran (enqueued-token limit): its keys go into a new chunk
    ABANDONED = "abandoned"  # never ran, and never will (a stale file, a stopped tenant)


# A chunk in one of these states may still have a batch (or results) at the provider.
OPEN_STATES = (ChunkState.INTENT, ChunkState.UPLOADED, ChunkState.SUBMITTED, ChunkState.ENDED)
# Chunks that never ran at the provider: their lines do not count as attempts.
NOT_RUN_STATES = (ChunkState.REQUEUED, ChunkState.ABANDONED)
LINE_COLUMNS = tuple(c.name for c in batch_lines.c)
_IN_CHUNK = 500


@dataclass(frozen=True, slots=True)
class LineRow:
    """One line of a chunk: the key and how to find its post again (no text)."""

    line_no: int
    key: str
    post_id: str
    content_hash: str
    attempt_no: int
    # The most tokens the line can bill (None on lines recorded before sql/005).
    bound_tokens: int | None = None
    # The most nano-dollars it can cost at the batch price (None before sql/015).
    bound_nanos: int | None = None


@dataclass
class Submission:
    """A ``batch_submissions`` row (the runner's copy; writes go through ``update``)."""

    chunk_id: str
    chunk_base: str
    seq: int
    tenant_id: str
    slice: int
    model: str
    key_version: str
    task_version: str
    lines: int
    file_sha256: str
    file_bytes: int
    run_id: str
    intent_at: datetime
    state: str = ChunkState.INTENT
    file_id: str | None = None
    batch_id: str | None = None
    provider_status: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    requests_total: int = 0
    requests_completed: int = 0
    requests_failed: int = 0
    reserved_tokens: int = 0
    reserved_nanos: int = 0
    errors: str | None = None
    submitted_at: datetime | None = None
    finished_at: datetime | None = None
    booked_at: datetime | None = None
    create_sent_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Any) -> Submission:
        """From a selected row."""
        data = row._mapping
        return cls(**{f.name: data[f.name] for f in fields(cls)})

    def values(self) -> dict[str, Any]:
        """Column values."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def next_seq(conn: Connection, base: str) -> int:
    """1 + the chunks already recorded for the same keys."""
    stmt = sa.select(sa.func.coalesce(sa.func.max(batch_submissions.c.seq), 0)).where(
        batch_submissions.c.chunk_base == base
    )
    return int(conn.execute(stmt).scalar_one()) + 1


def record_intent(
    fence: Fence,
    sub: Submission,
    lines: Sequence[LineRow],
    attempts: Sequence[dict[str, Any]],
    admit: Callable[[Connection], bool] | None = None,
) -> bool:
    """The chunk, its lines and each line's attempt event, in one transaction.

    ``admit`` runs first in the same transaction (the budget: does ``sub.reserved_tokens``
    fit the cap?); if it says no, nothing is written and False is returned. The reservation
    is then the row itself, durable from the moment it is granted. Like every step of a
    chunk, it commits only while the run holds the partition's writer lock (``fence``).
    """
    with fence.transaction() as conn:
        if admit is not None and not admit(conn):
            return False
        conn.execute(batch_submissions.insert().values(**sub.values()))
        rows = [
            {**_line_dict(line), "chunk_id": sub.chunk_id, "tenant_id": sub.tenant_id}
            for line in lines
        ]
        for row in rows:
            row["slice"] = sub.slice
        insert_rows(conn, batch_lines, LINE_COLUMNS, rows)
        now = db_time(conn.dialect.name, utcnow())
        for event in attempts:
            event["at"] = now
        insert_rows(conn, ledger_events, EVENT_COLUMNS, attempts)
    return True


def _line_dict(line: LineRow) -> dict[str, Any]:
    return {f.name: getattr(line, f.name) for f in fields(line)}


def update(fence: Fence, sub: Submission, **values: Any) -> None:
    """Change columns of a submission, in the store and on ``sub`` (under the run's locks)."""
    with fence.transaction() as conn:
        conn.execute(
            batch_submissions.update()
            .where(batch_submissions.c.chunk_id == sub.chunk_id)
            .values(**values)
        )
    for name, value in values.items():
        setattr(sub, name, value)


def open_submissions(conn: Connection, tenant_id: str, slices: Sequence[int]) -> list[Submission]:
    """A partition's chunks (of its stored ``slices``) that may still have work at the
    provider, oldest first."""
    stmt = (
        sa.select(batch_submissions)
        .where(
            batch_submissions.c.tenant_id == tenant_id,
            batch_submissions.c.slice.in_(list(slices)),
            batch_submissions.c.state.in_(OPEN_STATES),
        )
        .order_by(batch_submissions.c.intent_at, batch_submissions.c.chunk_id)
    )
    return [Submission.from_row(r) for r in conn.execute(stmt)]


def open_reserved(conn: Connection, tenant_id: str) -> Spend:
    """What the tenant's open chunks still hold (their batches can still bill it)."""
    stmt = sa.select(
        sa.func.coalesce(sa.func.sum(batch_submissions.c.reserved_tokens), 0),
        sa.func.coalesce(sa.func.sum(batch_submissions.c.reserved_nanos), 0),
    ).where(
        batch_submissions.c.tenant_id == tenant_id,
        batch_submissions.c.state.in_(OPEN_STATES),
    )
    tokens, nanos = conn.execute(stmt).one()
    return Spend(int(tokens), int(nanos))


def chunk_lines(conn: Connection, chunk_id: str) -> list[LineRow]:
    """The lines of a chunk in file order."""
    stmt = (
        sa.select(*(batch_lines.c[f.name] for f in fields(LineRow)))
        .where(batch_lines.c.chunk_id == chunk_id)
        .order_by(batch_lines.c.line_no)
    )
    return [LineRow(**r._mapping) for r in conn.execute(stmt)]


def post_texts(conn: Connection, tenant_id: str, post_ids: Sequence[str]) -> dict[str, Any]:
    """post_id -> (content_hash, text) of current posts, to rebuild a file after a crash."""
    out: dict[str, Any] = {}
    ids = list(post_ids)
    for i in range(0, len(ids), _IN_CHUNK):
        stmt = sa.select(posts.c.post_id, posts.c.content_hash, posts.c.text).where(
            posts.c.tenant_id == tenant_id, posts.c.post_id.in_(ids[i : i + _IN_CHUNK])
        )
        out.update({str(r.post_id): (str(r.content_hash), str(r.text)) for r in conn.execute(stmt)})
    return out


def prior_sends(conn: Connection, tenant_id: str, slice_no: int) -> dict[str, int]:
    """How often each key of a partition was sent in a chunk that ran (attempt numbers)."""
    stmt = (
        sa.select(batch_lines.c.key, sa.func.count())
        .join(batch_submissions, batch_submissions.c.chunk_id == batch_lines.c.chunk_id)
        .where(
            batch_lines.c.tenant_id == tenant_id,
            batch_lines.c.slice == slice_no,
            batch_submissions.c.state.not_in(NOT_RUN_STATES),
        )
        .group_by(batch_lines.c.key)
    )
    return {str(k): int(n) for k, n in conn.execute(stmt)}


def closed_lines(conn: Connection, sub: Submission) -> set[int]:
    """Line numbers whose attempt already has its usage or error event (a resumed booking)."""
    prefix = f"{sub.chunk_id}:"
    stmt = sa.select(ledger_events.c.attempt_id).where(
        ledger_events.c.tenant_id == sub.tenant_id,
        ledger_events.c.slice == sub.slice,
        ledger_events.c.type != EventKind.ATTEMPT,
        ledger_events.c.attempt_id.startswith(prefix, autoescape=True),
    )
    return {int(str(a)[len(prefix) :]) for a in conn.execute(stmt).scalars()}


def attempt_id(chunk: str, line_no: int) -> str:
    """The ledger attempt id of a batch line."""
    return f"{chunk}:{line_no}"


def state_counts(
    conn: Connection, tenant_ids: Sequence[str], run_id: str | None = None
) -> dict[str, int]:
    """Chunks per state for the tenants (of one run, if given): run summaries."""
    where: list[sa.ColumnElement[bool]] = [batch_submissions.c.tenant_id.in_(list(tenant_ids))]
    if run_id is not None:
        where.append(batch_submissions.c.run_id == run_id)
    stmt = (
        sa.select(batch_submissions.c.state, sa.func.count())
        .where(*where)
        .group_by(batch_submissions.c.state)
    )
    return {str(s): int(n) for s, n in conn.execute(stmt)}


def batch_durations(conn: Connection, model: str, newest: int = 200) -> list[float]:
    """Seconds from submission to the provider's end, for this model's newest ``newest``
    batches that completed: the history a deadline plan assumes batch speed from."""
    c = batch_submissions.c
    rows = conn.execute(
        sa.select(c.submitted_at, c.finished_at)
        .where(
            c.model == model,
            c.state.in_((ChunkState.ENDED, ChunkState.BOOKED)),
            c.provider_status == "completed",
            c.submitted_at.is_not(None),
            c.finished_at.is_not(None),
        )
        .order_by(c.finished_at.desc())
        .limit(newest)
    ).all()
    return [max(0.0, (r.finished_at - r.submitted_at).total_seconds()) for r in rows]
