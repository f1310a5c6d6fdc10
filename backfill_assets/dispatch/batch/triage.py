"""What each line of a finished batch means for its key (pure).

- ``answered``: a 200 with a completion; booked (usage) before its content is parsed, exactly
  like a synchronous answer, then accepted or ``schema_rejected`` by the output gate.
- ``rejected``: the provider refused the request itself (``invalid_request``, other 4xx);
  dead-lettered as ``transport_rejected``, never resubmitted.
- ``retry``: 429/408/409/5xx, a 200 that is no completion, a line the batch never ran
  (``batch_expired``, ``batch_cancelled``) or one missing from both files: resubmitted in a
  new batch, and only these lines.
- ``fatal``: 401/403/404 and account-level codes (``models.errors``, the taxonomy sync mode
  uses too): not the key's fault; it stays pending and the run stops after booking the chunk.

Stored texts are scrubbed of the line's own request (``echoes``: its post and user message;
``None`` when the post changed since it was sent: then no provider message is kept at all).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass

from backfill_assets.domain.caps import ERROR_CODE_CHARS
from backfill_assets.providers.batch_wire import OutputLine
from backfill_assets.providers.models.errors import Scope, classify
from backfill_assets.providers.models.moderation_wire import NO_USAGE, results_of
from backfill_assets.providers.models.openai_wire import (
    NotACompletion,
    error_code,
    error_summary,
    parse_completion,
)
from backfill_assets.providers.provider_text import UNCHECKED, safe_id, scrub


class Disposition(enum.StrEnum):
    """What happens to a key after its batch ended."""

    ANSWERED = "answered"
    REJECTED = "rejected"
    RETRY = "retry"
    FATAL = "fatal"


@dataclass(frozen=True, slots=True)
class TriagedLine:
    """A line's disposition with what the ledger books for it."""

    disposition: Disposition
    status: int | None
    message: str = ""
    request_id: str | None = None
    content: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    # 'split', 'total' (tokens_in holds the total) or 'missing' (no usage: book the bound).
    usage_shape: str = "split"
    # Of tokens_in: read from and written to the provider's prompt cache.
    tokens_cached: int = 0
    tokens_cache_written: int = 0
    tokens_reasoning: int = 0
    # The answer's tokens and their log-probabilities, when the line's body carried them.
    logprobs: tuple[tuple[str, float], ...] | None = None


def triage(
    line: OutputLine | None,
    secrets: Sequence[str] = (),
    echoes: Sequence[str] | None = (),
    moderation: bool = False,
) -> TriagedLine:
    """Classify one key's line (``None``: the key is in neither file); ``moderation``: the
    line's body is a moderation response of one input, not a chat completion."""
    if line is None:
        return TriagedLine(
            Disposition.RETRY, None, "missing from the batch's output and error files"
        )
    response = line.response
    if response is None:
        code = (line.error.code if line.error else None) or "error"
        code = UNCHECKED if echoes is None else scrub(code[:ERROR_CODE_CHARS], echoes, secrets)
        return TriagedLine(Disposition.RETRY, None, f"{code}: not run by the batch")
    status = response.status_code
    body = json.dumps(response.body).encode("utf-8")
    if 200 <= status < 300 and moderation:
        try:
            [result] = results_of(body, 1)
        except ValueError as exc:
            return TriagedLine(
                Disposition.RETRY, status, f"HTTP {status}: {exc}", response.request_id
            )
        return TriagedLine(
            Disposition.ANSWERED,
            status,
            request_id=response.request_id,
            content=json.dumps(result, sort_keys=True, separators=(",", ":")),
            usage_shape=NO_USAGE,
        )
    if 200 <= status < 300:
        try:
            completion = parse_completion(body)
        except NotACompletion as exc:
            return TriagedLine(
                Disposition.RETRY, status, f"HTTP {status}: {exc}", response.request_id
            )
        billed = completion.billed
        return TriagedLine(
            Disposition.ANSWERED,
            status,
            request_id=response.request_id or safe_id(completion.id),
            content=completion.content,
            tokens_in=billed.tokens_in if billed else 0,
            tokens_out=billed.tokens_out if billed else 0,
            usage_shape=billed.shape if billed else "missing",
            tokens_cached=billed.cached if billed else 0,
            tokens_cache_written=billed.cache_written if billed else 0,
            tokens_reasoning=billed.reasoning if billed else 0,
            logprobs=completion.logprobs,
        )
    # Only the scrubbed summary is kept: a provider may echo the request (post text).
    summary, _raw = error_summary(
        status, body, "application/json", echoes=echoes or (), secrets=secrets
    )
    if echoes is None:
        summary = f"HTTP {status}: {UNCHECKED}"
    scope = classify(status, error_code(response.body))
    disposition = {Scope.RUN: Disposition.FATAL, Scope.KEY: Disposition.REJECTED}.get(
        scope, Disposition.RETRY
    )
    return TriagedLine(disposition, status, summary, response.request_id)
