"""Batch input validation and per-line answers (no I/O; the meter is passed in).

Input: one JSON request per line, ``{"custom_id", "method": "POST", "url", "body"}``. Output
lines follow OpenAI's shape::

    {"id": "batch_req_..", "custom_id": .., "response": {"status_code", "request_id", "body"},
     "error": null}
    {"id": "batch_req_..", "custom_id": .., "response": null,
     "error": {"code": "batch_expired", "message": ..}}

Line-level failures come from the same fault plan as synchronous calls (``faults`` and
``fault_by_key``): a status fault becomes an error line with that status, a content fault a
billed 200 with a distorted answer. ``prompt_token_factor`` applies to a line's billed prompt
(and so to the enqueued-token limit), ``batch_usage_shape`` to the ``usage`` an output line
shows. With ``echo_errors`` every error about a line (error lines, validation errors) quotes
its user message verbatim, or the raw line when it has none.

Batches on ``/v1/moderations`` take moderation bodies (see ``moderations.py``) and answer each
line with the synchronous endpoint's body in ``response.body``, billed at zero as there. A
line's key is the sha256 hex of its first input, as for a synchronous call; its input tokens
count against the enqueued-token limit. A ``malformed`` fault makes ``response.body`` the
first half of the encoded answer, as a JSON string, where an object belongs.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from backfill_assets.providers.models.rules import count_tokens
from backfill_assets.providersim.access import refusal
from backfill_assets.providersim.answers import (
    answer_content,
    answer_logprobs,
    corpus_answer,
    fault_error,
)
from backfill_assets.providersim.billing.meter import MODERATIONS_ENDPOINT, BilledCall, Meter
from backfill_assets.providersim.billing.pricing import call_cost_nanos
from backfill_assets.providersim.billing.usage import billed_prompt, cached_tokens, usage_body
from backfill_assets.providersim.config import FaultKind, SimConfig
from backfill_assets.providersim.faults import decide_fault
from backfill_assets.providersim.moderations import (
    DEFAULT_MODERATION_MODEL,
    ModerationRequest,
    cut_off,
    input_tokens,
    moderation_answer,
    moderation_text_in,
    parse_moderation_request,
)
from backfill_assets.providersim.moderations import correlation_id_of as moderation_key
from backfill_assets.providersim.wire import (
    ApiError,
    ChatRequest,
    completion_body,
    correlation_id_of,
    last_user_text,
    new_request_id,
    parse_chat_request,
    post_text_of,
    prompt_tokens,
    quoted,
    user_text_in,
)

_MAX_ERRORS = 20
# Faults that cannot happen inside a provider's batch worker become a server error line.
_SERVER_SIDE: frozenset[FaultKind] = frozenset({"500", "502", "503", "timeout", "reset"})
_REFUSALS: frozenset[FaultKind] = frozenset({"401", "403", "404"})
_UNFINISHED_MESSAGES = {
    "batch_expired": "This request could not be executed before the completion window expired.",
    "batch_cancelled": "This request was not executed because the batch was cancelled.",
}


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One validated request of a batch file: a chat request, or a moderation request."""

    custom_id: str
    chat: ChatRequest | None
    # Tokens counted against the enqueued-token limit (chat: also the billed prompt).
    prompt: int
    correlation_id: str
    post: str
    user: str
    moderation: ModerationRequest | None = None

    @property
    def model(self) -> str:
        """The model the line asks for."""
        if self.chat is not None:
            return self.chat.model
        return self.moderation.model if self.moderation is not None else "unknown"


def error_item(
    code: str, message: str, line: int | None, param: str | None = None, echo: str | None = None
) -> dict[str, Any]:
    """An entry of a batch's ``errors.data``; ``echo`` is quoted verbatim when given."""
    if echo is not None:
        message = quoted(message, echo)
    return {"code": code, "message": message, "param": param, "line": line}


def _echo_of(raw: bytes) -> str:
    try:
        item = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        item = None
    body = item.get("body") if isinstance(item, dict) else None
    found = user_text_in(body)
    if found is None:
        found = moderation_text_in(body)
    return found if found is not None else raw.decode("utf-8", "replace")


_Parsed = ChatRequest | ModerationRequest


def _check_line(raw: bytes, number: int, endpoint: str) -> tuple[_Parsed, str] | dict[str, Any]:
    try:
        item = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return error_item("invalid_json_line", "This line is not parseable as valid JSON.", number)
    if not isinstance(item, dict):
        return error_item("invalid_json_line", "This line is not a JSON object.", number)
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return error_item("missing_required_parameter", "Missing 'custom_id'.", number, "custom_id")
    if item.get("method") != "POST":
        return error_item("invalid_value", "Only POST is supported.", number, "method")
    if item.get("url") != endpoint:
        return error_item("mismatched_endpoint", f"The url must be {endpoint}.", number, "url")
    body = item.get("body")
    if not isinstance(body, dict):
        return error_item("missing_required_parameter", "Missing 'body'.", number, "body")
    encoded = json.dumps(body).encode("utf-8")
    try:
        if endpoint == MODERATIONS_ENDPOINT:
            return parse_moderation_request(encoded), custom_id
        return parse_chat_request(encoded), custom_id
    except ApiError as exc:
        return error_item(exc.code or "invalid_request", exc.message, number, exc.param)


def _parse_line(
    raw: bytes, number: int, endpoint: str, config: SimConfig
) -> BatchLine | dict[str, Any]:
    checked = _check_line(raw, number, endpoint)
    if isinstance(checked, dict):
        if config.echo_errors:
            checked = error_item(**checked, echo=_echo_of(raw))
        return checked
    request, custom_id = checked
    if isinstance(request, ModerationRequest):
        return BatchLine(
            custom_id,
            None,
            input_tokens(request),
            moderation_key(request),
            "",
            request.texts[0],
            request,
        )
    chat = request
    user = last_user_text(chat)
    return BatchLine(
        custom_id,
        chat,
        billed_prompt(prompt_tokens(chat), config.prompt_token_factor),
        correlation_id_of(user) or custom_id,
        post_text_of(user),
        user,
    )


def models_named(content: bytes, endpoint: Any = None) -> list[str]:
    """The distinct ``body.model`` values of a batch input file, in order (best effort); on
    ``/v1/moderations`` a body without one names the default moderation model."""
    default = DEFAULT_MODERATION_MODEL if endpoint == MODERATIONS_ENDPOINT else None
    found: dict[str, None] = {}
    for raw in content.split(b"\n"):
        try:
            item = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            continue
        body = item.get("body") if isinstance(item, dict) else None
        model = body.get("model", default) if isinstance(body, dict) else None
        if isinstance(model, str):
            found[model] = None
    return list(found)


def parse_input_file(
    content: bytes, endpoint: str, config: SimConfig
) -> tuple[list[BatchLine], list[dict[str, Any]]]:
    """Validated lines and validation errors (a batch with any error fails as a whole)."""
    max_lines = config.batch_max_lines
    lines: list[BatchLine] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    models: set[str] = set()
    raw_lines = [r for r in content.split(b"\n") if r.strip()]
    if not raw_lines:
        errors.append(error_item("empty_file", "The input file has no requests.", 0))
    if len(raw_lines) > max_lines:
        message = f"A batch can hold at most {max_lines:,} requests."
        errors.append(error_item("too_many_requests", message, max_lines))
    for number, raw in enumerate(raw_lines, start=1):
        parsed = _parse_line(raw, number, endpoint, config)
        if isinstance(parsed, dict):
            errors.append(parsed)
        elif parsed.custom_id in seen:
            echo = parsed.user if config.echo_errors else None
            message = "The custom_id must be unique."
            errors.append(error_item("duplicate_custom_id", message, number, "custom_id", echo))
        else:
            seen.add(parsed.custom_id)
            models.add(parsed.model)
            lines.append(parsed)
        if len(errors) >= _MAX_ERRORS:
            break
    if len(models) > 1:
        errors.append(error_item("model_mismatch", "All requests must use the same model.", 0))
    return lines, errors


def answer_line(config: SimConfig, meter: Meter, line: BatchLine, batch_id: str) -> dict[str, Any]:
    """Run one request: an output line (billed) or an error line (free)."""
    attempt = meter.record_attempt(line.correlation_id)
    fault = decide_fault(config, line.correlation_id, attempt)
    request_id = new_request_id()
    model = line.model
    error: ApiError | None = None
    if fault in _SERVER_SIDE:
        error = fault_error("500", model)
    elif fault == "429":
        error = fault_error("429", model)
    elif fault == "400":
        error = fault_error("400", model)
    elif fault in _REFUSALS:
        error = refusal(fault, model, None, config.forbid)
    if error is not None:
        if config.echo_errors:
            error = error.quoting(line.user)
        response = {"status_code": error.status, "request_id": request_id, "body": error.body()}
        return _output_line(line.custom_id, response, None)
    if line.moderation is not None:
        return _moderation_line(config, meter, line, line.moderation, fault, request_id, batch_id)
    assert line.chat is not None  # a line holds one request or the other
    given = corpus_answer(config, model, line.post, line.chat.response_schema)
    content, finish_reason = answer_content(
        fault, line.correlation_id, line.post, line.chat.response_schema, given
    )
    completion = count_tokens(content)
    cached = cached_tokens(line.prompt, config.cached_prefix_tokens)
    cost = call_cost_nanos(config.prices, model, line.prompt, cached, completion, "batch")
    meter.bill(
        BilledCall(
            request_id,
            line.correlation_id,
            model,
            line.prompt,
            completion,
            batch_id,
            cached,
            "batch",
            cost,
            time.time(),
        )
    )
    usage = usage_body(config.batch_usage_shape, line.prompt, completion, cached)
    chat = line.chat
    p_label = given.p_label if given is not None else None
    logprobs = (
        answer_logprobs(content, line.correlation_id, chat.top_logprobs, p_label)
        if chat.logprobs
        else None
    )
    body = completion_body(model, content, finish_reason, usage, "default", logprobs)
    return _output_line(
        line.custom_id, {"status_code": 200, "request_id": request_id, "body": body}, None
    )


def _moderation_line(
    config: SimConfig,
    meter: Meter,
    line: BatchLine,
    request: ModerationRequest,
    fault: FaultKind | None,
    request_id: str,
    batch_id: str,
) -> dict[str, Any]:
    """A moderation line's answer, billed at zero like a synchronous moderation call."""
    meter.bill(
        BilledCall(
            request_id,
            line.correlation_id,
            request.model,
            0,
            0,
            batch_id,
            service_tier="batch",
            billed_at=time.time(),
            endpoint=MODERATIONS_ENDPOINT,
        )
    )
    answer = moderation_answer(request, config, fault)
    body: Any = cut_off(json.dumps(answer)) if fault == "malformed" else answer
    return _output_line(
        line.custom_id, {"status_code": 200, "request_id": request_id, "body": body}, None
    )


def unfinished_line(line: BatchLine, code: str, config: SimConfig) -> dict[str, Any]:
    """An error line for a request the batch never ran (expired or cancelled)."""
    message = _UNFINISHED_MESSAGES[code]
    if config.echo_errors:
        message = quoted(message, line.user)
    return _output_line(line.custom_id, None, {"code": code, "message": message})


def _output_line(
    custom_id: str, response: dict[str, Any] | None, error: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "id": f"batch_req_{secrets.token_hex(12)}",
        "custom_id": custom_id,
        "response": response,
        "error": error,
    }


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    """JSONL bytes (empty when there are no lines)."""
    return b"".join(json.dumps(line).encode("utf-8") + b"\n" for line in lines)
