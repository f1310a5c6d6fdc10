"""Batch jobs as a lazy state machine: states advance when anyone looks, in time order.

validating -> failed (bad file, simulated failure, enqueued-token limit)
           -> in_progress -> finalizing -> completed
                          -> expired (the first ``batch_expire_count`` batches: a share of
                             lines finished and billed, the rest ``batch_expired``)
           cancel: -> cancelling -> cancelled (lines not yet run are ``batch_cancelled``)

No background task: every API call first applies the transitions that are due, oldest first,
so the enqueued-token limit sees exactly the batches that were in progress at that moment.
Lines are run (and billed) when their batch finishes.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from backfill_assets.providersim.batch.files import FileStore
from backfill_assets.providersim.batch.lines import (
    BatchLine,
    answer_line,
    error_item,
    jsonl,
    parse_input_file,
    unfinished_line,
)
from backfill_assets.providersim.billing.meter import Meter
from backfill_assets.providersim.config import SimConfig
from backfill_assets.providersim.faults import unit_draw
from backfill_assets.providersim.wire import ApiError

ENDPOINTS = frozenset(
    {"/v1/chat/completions", "/v1/embeddings", "/v1/completions", "/v1/moderations"}
)
ACTIVE = frozenset({"in_progress", "finalizing"})
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
_MAX_METADATA = 16


@dataclass
class SimBatch:
    """One batch job."""

    id: str
    index: int
    input_file_id: str
    endpoint: str
    metadata: dict[str, str] | None
    created_at: float
    status: str = "validating"
    next_at: float | None = None
    started_at: float | None = None
    lines: list[BatchLine] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)
    output_file_id: str | None = None
    error_file_id: str | None = None
    completed: int = 0
    failed: int = 0
    ran: int = 0

    @property
    def enqueued_tokens(self) -> int:
        """Prompt tokens this batch holds against the organisation's enqueued limit."""
        return sum(line.prompt for line in self.lines)


class BatchStore:
    """All batches of the simulated organisation."""

    def __init__(
        self,
        config: SimConfig,
        meter: Meter,
        files: FileStore,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._meter = meter
        self._files = files
        self._clock = clock
        self._wall0 = time.time() - clock()
        self._batches: dict[str, SimBatch] = {}
        self._order: list[str] = []

    def create(self, body: Any) -> SimBatch:
        """``POST /v1/batches``; request errors are 400s, file problems fail validation."""
        if not isinstance(body, dict):
            raise ApiError(400, "Invalid request body: expected a JSON object.")
        file_id = body.get("input_file_id")
        if not isinstance(file_id, str):
            raise ApiError(
                400, "Missing required parameter: 'input_file_id'.", param="input_file_id"
            )
        if self._files.get(file_id).purpose != "batch":
            raise ApiError(400, "The input file must have purpose 'batch'.", param="input_file_id")
        endpoint = body.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise ApiError(400, f"Invalid endpoint {endpoint!r}.", param="endpoint")
        if body.get("completion_window") != "24h":
            raise ApiError(400, "completion_window must be '24h'.", param="completion_window")
        metadata = _metadata(body.get("metadata"))
        self.advance()
        now = self._clock()
        batch = SimBatch(
            id=f"batch_{secrets.token_hex(12)}",
            index=len(self._order),
            input_file_id=file_id,
            endpoint=str(endpoint),
            metadata=metadata,
            created_at=now,
            next_at=now + self.config.batch_validating_ms / 1000.0,
        )
        self._batches[batch.id] = batch
        self._order.append(batch.id)
        key = self.config.batch_chunk_metadata_key
        self._meter.record_batch_create((metadata or {}).get(key, ""))
        return batch

    def get(self, batch_id: str) -> SimBatch:
        """A batch, or 404."""
        self.advance()
        found = self._batches.get(batch_id)
        if found is None:
            raise ApiError(404, f"No batch found with id '{batch_id}'.", param="batch_id")
        return found

    def page(self, after: str | None, limit: int) -> tuple[list[SimBatch], bool]:
        """Newest first, starting after the batch id ``after``; young ones lag (list only)."""
        self.advance()
        newest = list(reversed(self._order))
        start = newest.index(after) + 1 if after in self._batches else 0
        shown_until = self._clock() - self.config.batch_list_lag_ms / 1000.0
        rest = [i for i in newest[start:] if self._batches[i].created_at <= shown_until]
        return [self._batches[i] for i in rest[:limit]], len(rest) > limit

    def cancel(self, batch_id: str) -> SimBatch:
        """``POST /v1/batches/{id}/cancel``."""
        batch = self.get(batch_id)
        if batch.status in TERMINAL or batch.status == "cancelling":
            return batch
        now = self._clock()
        batch.ran = self._progress(batch, now)
        batch.status = "cancelling"
        batch.times["cancelling_at"] = now
        # The lines already run are billed when it ends, so they must not be sent again.
        cfg = self.config
        batch.next_at = now + (cfg.batch_finalizing_ms + cfg.batch_cancel_ms) / 1000.0
        return batch

    def advance(self) -> None:
        """Apply every transition that is due, oldest first."""
        now = self._clock()
        while True:
            due = [b for b in self._batches.values() if b.next_at is not None and b.next_at <= now]
            if not due:
                return
            batch = min(due, key=lambda b: (b.next_at or 0.0, b.index))
            self._step(batch, batch.next_at or now)

    def _step(self, batch: SimBatch, at: float) -> None:
        cfg = self.config
        if batch.status == "validating":
            self._validate(batch, at)
        elif batch.status == "in_progress":
            if batch.index < cfg.batch_expire_count:
                share = cfg.batch_expire_finished_share
                self._finish(batch, at, "expired", math.floor(share * len(batch.lines)))
            else:
                batch.status, batch.times["finalizing_at"] = "finalizing", at
                batch.next_at = at + cfg.batch_finalizing_ms / 1000.0
        elif batch.status == "finalizing":
            self._finish(batch, at, "completed", len(batch.lines))
        elif batch.status == "cancelling":
            self._finish(batch, at, "cancelled", batch.ran)

    def _validate(self, batch: SimBatch, at: float) -> None:
        cfg = self.config
        content = self._files.get(batch.input_file_id).content
        lines, errors = parse_input_file(content, batch.endpoint, cfg)
        batch.lines = lines
        # With echo_errors, batch-level errors quote the first request, as line 1 is blamed.
        echo = lines[0].user if cfg.echo_errors and lines else None
        if not errors and batch.index < cfg.batch_fail_count:
            errors = [error_item("invalid_request", "Simulated validation failure.", 1, None, echo)]
        if not errors and cfg.enqueued_token_limit:
            active = sum(b.enqueued_tokens for b in self._batches.values() if b.status in ACTIVE)
            if active + batch.enqueued_tokens > cfg.enqueued_token_limit:
                model = lines[0].model if lines else "unknown"
                message = (
                    f"Enqueued token limit reached for {model} in organization org-providersim. "
                    f"Limit: {cfg.enqueued_token_limit:,} enqueued tokens. Please try again "
                    "once some in_progress batches have been completed."
                )
                errors = [error_item("token_limit_exceeded", message, None, None, echo)]
        if errors:
            batch.status, batch.errors, batch.next_at = "failed", errors, None
            batch.times["failed_at"] = at
            return
        batch.status, batch.started_at = "in_progress", at
        batch.times["in_progress_at"] = at
        batch.next_at = at + cfg.batch_processing_ms / 1000.0

    def _ordered(self, batch: SimBatch) -> list[BatchLine]:
        # The order lines run in (and appear in the output): not the input order.
        seed = self.config.seed
        return sorted(
            batch.lines, key=lambda ln: unit_draw(seed, "order", batch.index, ln.custom_id)
        )

    def _finish(self, batch: SimBatch, at: float, status: str, runs: int) -> None:
        outputs: list[dict[str, Any]] = []
        failures: list[dict[str, Any]] = []
        code = "batch_cancelled" if status == "cancelled" else "batch_expired"
        for n, line in enumerate(self._ordered(batch)):
            if n >= runs:
                failures.append(unfinished_line(line, code, self.config))
                continue
            out = answer_line(self.config, self._meter, line, batch.id)
            (outputs if out["response"]["status_code"] == 200 else failures).append(out)
        name = batch.id
        if outputs:
            batch.output_file_id = self._files.add(
                "batch_output", f"{name}_output.jsonl", jsonl(outputs)
            ).id
        if failures:
            batch.error_file_id = self._files.add(
                "batch_output", f"{name}_error.jsonl", jsonl(failures)
            ).id
        batch.completed, batch.failed = len(outputs), len(failures)
        batch.status, batch.next_at = status, None
        batch.times[f"{status}_at"] = at

    def _progress(self, batch: SimBatch, now: float) -> int:
        if batch.status != "in_progress" or batch.started_at is None:
            return len(batch.lines) if batch.status == "finalizing" else 0
        span = self.config.batch_processing_ms / 1000.0
        share = 1.0 if span <= 0 else min(1.0, (now - batch.started_at) / span)
        if batch.index < self.config.batch_expire_count:
            share *= self.config.batch_expire_finished_share
        return math.floor(share * len(batch.lines))

    def to_json(self, batch: SimBatch) -> dict[str, Any]:
        """The API's batch object, with live request counts."""
        if batch.status in TERMINAL:
            done, failed = batch.completed, batch.failed
        else:
            done, failed = self._progress(batch, self._clock()), 0
        epoch = {name: int(self._wall0 + t) for name, t in batch.times.items()}
        created = int(self._wall0 + batch.created_at)
        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": batch.endpoint,
            "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
            "input_file_id": batch.input_file_id,
            "completion_window": "24h",
            "status": batch.status,
            "output_file_id": batch.output_file_id,
            "error_file_id": batch.error_file_id,
            "created_at": created,
            "expires_at": created + 24 * 3600,
            **{name: epoch.get(name) for name in _TIME_FIELDS},
            "request_counts": {"total": len(batch.lines), "completed": done, "failed": failed},
            "metadata": batch.metadata,
        }


_TIME_FIELDS = (
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)


def _metadata(raw: Any) -> dict[str, str] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) > _MAX_METADATA:
        raise ApiError(400, "metadata must be an object of at most 16 pairs.", param="metadata")
    for key, value in raw.items():
        if not isinstance(value, str) or len(key) > 64 or len(value) > 512:
            raise ApiError(
                400, "metadata keys are at most 64 and values 512 characters.", param="metadata"
            )
    return dict(raw)
