"""The rows a run books, typed: the sync dispatcher, batch mode and the writer build them here,
so all three book the same way. Each is a mapping of its table's columns (the writer adds the
commit time, ``at`` or ``created_at``, None until then)."""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict

from backfill_assets.domain.caps import REASON_CHARS
from backfill_assets.domain.policy.output_gate import ModerationOutput
from backfill_assets.domain.work.events import EventKind
from backfill_assets.domain.work.keys import Versions
from backfill_assets.domain.work.outcomes import Outcome


class KeyRow(TypedDict):
    """A key with its derivation: the common part of result and dead-letter rows."""

    key: str
    tenant_id: str
    post_id: str
    slice: int
    content_hash: str
    model: str
    key_version: str
    task_version: str
    run_id: str


class ResultRow(KeyRow):
    """An accepted label (the ``results`` table), with what the frame check reads
    (``correlation_id``, ``schema_version``) and where it goes and what it clears."""

    label: str
    rule_ids: str
    confidence: float
    # The chosen label's probability from the wire (None: none was given).
    p_label: float | None
    # In a mapped dialect: the answer as returned and the section's hash it was read under.
    raw_result: str | None
    mapping: str | None
    # A cascade's stage that decided (only on its composed labels: cascade_routes.py).
    stage: str | None
    correlation_id: str
    schema_version: int
    partition: str
    # The key may have an earlier retry_exhausted dead letter to clear.
    had_dead_letter: bool
    created_at: datetime | str | None


class DeadRow(KeyRow):
    """A dead letter (the ``dead_letters`` table): the key's last failure."""

    outcome: str
    reason: str
    attempts: int
    at: datetime | str | None


class EventRow(TypedDict):
    """A ledger event (the ``ledger_events`` table)."""

    tenant_id: str
    key: str
    attempt_id: str
    attempt_no: int
    type: str
    slice: int
    post_id: str | None
    content_hash: str | None
    model: str
    key_version: str | None
    task_version: str | None
    tokens_in: int
    tokens_out: int
    cost_nanos: int
    tokens_cached: int
    tokens_cache_written: int
    request_id: str | None
    status: int | None
    message: str | None
    run_id: str
    usage_shape: str | None
    bound_tokens: int | None
    service_tier: str | None
    price_booked: str | None
    cost_unknown: int
    tokens_reasoning: int
    at: datetime | str | None


def key_row(
    versions: Versions,
    run_id: str,
    *,
    key: str,
    tenant_id: str,
    post_id: str,
    slice_no: int,
    content_hash: str,
) -> KeyRow:
    """A key with its derivation: the common part of result and dead-letter rows."""
    return {
        "key": key,
        "tenant_id": tenant_id,
        "post_id": post_id,
        "slice": slice_no,
        "content_hash": content_hash,
        "model": versions.model,
        "key_version": versions.key_version,
        "task_version": versions.task_version,
        "run_id": run_id,
    }


def event_row(
    versions: Versions,
    run_id: str,
    kind: str,
    *,
    key: str,
    tenant_id: str,
    slice_no: int,
    attempt_id: str,
    attempt_no: int,
    post_id: str,
    content_hash: str,
) -> EventRow:
    """A ledger event; callers fill tokens, cost, request id, status or message."""
    first = kind == EventKind.ATTEMPT
    return {
        "tenant_id": tenant_id,
        "key": key,
        "attempt_id": attempt_id,
        "attempt_no": attempt_no,
        "type": kind,
        "slice": slice_no,
        # Only the attempt carries the key's derivation; later events point at it.
        "post_id": post_id if first else None,
        "content_hash": content_hash if first else None,
        "model": versions.model,
        "key_version": versions.key_version if first else None,
        "task_version": versions.task_version if first else None,
        "tokens_in": 0,
        "tokens_out": 0,
        "cost_nanos": 0,
        "tokens_cached": 0,
        "tokens_cache_written": 0,
        "request_id": None,
        "status": None,
        "message": None,
        "run_id": run_id,
        "usage_shape": None,
        "bound_tokens": None,
        "service_tier": None,
        "price_booked": None,
        "cost_unknown": 0,
        "tokens_reasoning": 0,
        "at": None,
    }


def _key_of(row: KeyRow) -> KeyRow:
    """Only the key's own fields of ``row`` (a result row is a key row too)."""
    return {
        "key": row["key"],
        "tenant_id": row["tenant_id"],
        "post_id": row["post_id"],
        "slice": row["slice"],
        "content_hash": row["content_hash"],
        "model": row["model"],
        "key_version": row["key_version"],
        "task_version": row["task_version"],
        "run_id": row["run_id"],
    }


def result_row(
    key: KeyRow,
    out: ModerationOutput,
    partition: str,
    had_dead_letter: bool,
    p_label: float | None = None,
    stored: tuple[str, str] | None = None,
) -> ResultRow:
    """An accepted label on its key's row (``key_row``); the writer validates it again as a
    frame. ``had_dead_letter``: the key may have an earlier retry_exhausted dead letter to
    clear; ``p_label``: the label's probability, where the wire gave one; ``stored``: in a
    mapped dialect, (the answer as returned, the mapping it was read under)."""
    return ResultRow(
        **_key_of(key),
        label=out.label,
        rule_ids=",".join(out.rule_ids),
        confidence=out.confidence,
        p_label=p_label,
        raw_result=stored[0] if stored else None,
        mapping=stored[1] if stored else None,
        stage=None,
        correlation_id=out.correlation_id,
        schema_version=out.schema_version,
        partition=partition,
        had_dead_letter=had_dead_letter,
        created_at=None,
    )


def dead_row(key: KeyRow, outcome: Outcome, reason: str, attempts: int) -> DeadRow:
    """A dead letter on its key's row (replaces any earlier one for the key); ``key`` may be a
    result row the frame check rejected."""
    return DeadRow(
        **_key_of(key),
        outcome=str(outcome),
        reason=reason[:REASON_CHARS],
        attempts=attempts,
        at=None,
    )
