"""Row shapes shared by the sync dispatcher and batch mode, so both book the same way."""

from __future__ import annotations

from typing import Any

from backfill_assets.core.caps import REASON_CHARS
from backfill_assets.core.events import EventKind
from backfill_assets.core.keys import Versions
from backfill_assets.core.outcomes import Outcome
from backfill_assets.core.rubric import ModerationOutput

Row = dict[str, Any]


def key_row(
    versions: Versions,
    run_id: str,
    *,
    key: str,
    tenant_id: str,
    post_id: str,
    slice_no: int,
    content_hash: str,
) -> Row:
    """A key with its derivation: the common part of result and dead-letter rows."""
    return {
        "key": key,
        "tenant_id": tenant_id,
        "post_id": post_id,
        "slice": slice_no,
        "content_hash": content_hash,
        "model": versions.model,
        "prompt_version": versions.prompt_version,
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
) -> Row:
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
        "prompt_version": versions.prompt_version if first else None,
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
    }


def result_row(key: Row, out: ModerationOutput, partition: str, had_dead_letter: bool) -> Row:
    """An accepted label on its key's row (``key_row``); the writer validates it again as a
    frame. ``had_dead_letter``: the key may have an earlier retry_exhausted dead letter to
    clear."""
    return {
        **key,
        "label": out.label,
        "rule_ids": ",".join(out.rule_ids),
        "confidence": out.confidence,
        "correlation_id": out.correlation_id,
        "schema_version": out.schema_version,
        "partition": partition,
        "had_dead_letter": had_dead_letter,
    }


def dead_row(key: Row, outcome: Outcome, reason: str, attempts: int) -> Row:
    """A dead letter on its key's row (replaces any earlier one for the key)."""
    return {**key, "outcome": str(outcome), "reason": reason[:REASON_CHARS], "attempts": attempts}
