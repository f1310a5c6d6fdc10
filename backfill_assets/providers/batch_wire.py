"""Batch API wire format: input lines, the batch object and output lines (pure, pydantic).

Request bodies are the synchronous adapter's (``models.openai_wire.request_body``, or
``models.moderation_wire.moderation_body`` for moderations), so a key costs the same prompt in
both modes; answers are parsed with the same envelope model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from backfill_assets.domain.money.prices import Tier
from backfill_assets.providers.models.base import ModelRequest
from backfill_assets.providers.models.moderation_wire import ENDPOINT as MODERATIONS
from backfill_assets.providers.models.moderation_wire import moderation_body
from backfill_assets.providers.models.openai_wire import request_body
from backfill_assets.providers.provider_text import ProviderId, RecordedId

ENDPOINT = "/v1/chat/completions"
TERMINAL_STATUSES = frozenset({"completed", "failed", "expired", "cancelled"})


def input_line(
    request: ModelRequest, max_tokens_param: str, url: str = ENDPOINT, *, logprobs: bool
) -> bytes:
    """One JSONL request to ``url`` (chat completions, or moderations: one post as a one-input
    array); ``custom_id`` is the key. Canonical JSON: same input, same bytes. ``logprobs``:
    a chat line asks for its answer's token log-probabilities (``BACKFILL_LOGPROBS``)."""
    body = (
        moderation_body(request)
        if url == MODERATIONS
        else request_body(request, max_tokens_param, Tier.STANDARD, logprobs)
    )
    line = {"custom_id": request.key, "method": "POST", "url": url, "body": body}
    text = json.dumps(line, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8") + b"\n"


class _Lenient(BaseModel):
    # Providers add fields freely; only what we read is declared.
    model_config = ConfigDict(extra="ignore", frozen=True)


class BatchErrorItem(_Lenient):
    """One validation error of a failed batch."""

    code: str | None = None
    message: str | None = None
    line: int | None = None


class BatchErrors(_Lenient):
    """``errors`` of a batch object."""

    data: list[BatchErrorItem] = Field(default_factory=list)


class RequestCounts(_Lenient):
    """Progress of a batch."""

    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchObject(_Lenient):
    """The parts of a batch object we act on."""

    id: ProviderId
    status: str = Field(pattern=r"^[a-z_]{1,32}$")
    input_file_id: ProviderId | None = None
    output_file_id: ProviderId | None = None
    error_file_id: ProviderId | None = None
    errors: BatchErrors | None = None
    request_counts: RequestCounts = Field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None
    created_at: int | None = None
    # Epoch seconds of a cancel: asked, and ended (how long a cancel takes, as the provider
    # measured it).
    cancelling_at: int | None = None
    cancelled_at: int | None = None

    @property
    def terminal(self) -> bool:
        """No further change will happen."""
        return self.status in TERMINAL_STATUSES


class BatchPage(_Lenient):
    """One page of ``GET /batches``."""

    data: list[BatchObject] = Field(default_factory=list)
    has_more: bool = False
    last_id: RecordedId = None


class LineResponse(_Lenient):
    """``response`` of an output line."""

    status_code: int = Field(ge=100, le=599)
    request_id: RecordedId = None
    body: Any = None


class LineError(_Lenient):
    """``error`` of an output line (``batch_expired``, ``batch_cancelled``, ...)."""

    code: str | None = None
    message: str | None = None


class OutputLine(_Lenient):
    """One line of an output or error file."""

    id: RecordedId = None
    custom_id: str
    response: LineResponse | None = None
    error: LineError | None = None


def output_lines(content: Iterable[bytes]) -> tuple[dict[str, OutputLine], int]:
    """Lines by ``custom_id`` (the output order is not the input order) and unreadable lines;
    ``content``: the file's lines (an open binary file, or ``bytes.splitlines()``)."""
    found: dict[str, OutputLine] = {}
    unreadable = 0
    for raw in content:
        if not raw.strip():
            continue
        try:
            line = OutputLine.model_validate_json(raw)
        except (ValidationError, ValueError, RecursionError):
            unreadable += 1
            continue
        found[line.custom_id] = line
    return found, unreadable
