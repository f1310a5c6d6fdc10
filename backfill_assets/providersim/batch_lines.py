"""Batch input validation and per-line answers (no I/O; the meter is passed in).

Input: one JSON request per line, ``{"custom_id", "method": "POST", "url", "body"}``. Output
lines follow OpenAI's shape::

    {"id": "batch_req_..", "custom_id": .., "response": {"status_code", "request_id", "body"},
     "error": null}
    {"id": "batch_req_..", "custom_id": .., "response": null,
     "error": {"code": "batch_expired", "message": ..}}

Line-level failures come from the same fault plan as synchronous calls (``faults`` and
``fault_by_key``): a status fault becomes an error line with that status, a content fault a
billed 200 with a distorted answer.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from backfill_assets.models.rules import count_tokens
from backfill_assets.providersim.answers import answer_content, fault_error
from backfill_assets.providersim.config import FaultKind, SimConfig
from backfill_assets.providersim.faults import decide_fault
from backfill_assets.providersim.meter import BilledCall, Meter
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
)

_MAX_ERRORS = 20
# Faults that cannot happen inside a provider's batch worker become a server error line.
_SERVER_SIDE: frozenset[FaultKind] = frozenset({"500", "502", "503", "timeout", "reset"})
_UNFINISHED_MESSAGES = {
    "batch_expired": "This request could not be executed before the completion window expired.",
    "batch_cancelled": "This request was not executed because the batch was cancelled.",
}


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One validated request of a batch file."""

    custom_id: str
    chat: ChatRequest
    prompt: int
    correlation_id: str
    post: str


def _error(code: str, message: str, line: int, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def _parse_line(raw: bytes, number: int, endpoint: str) -> BatchLine | dict[str, Any]:
    try:
        item = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return _error("invalid_json_line", "This line is not parseable as valid JSON.", number)
    if not isinstance(item, dict):
        return _error("invalid_json_line", "This line is not a JSON object.", number)
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _error("missing_required_parameter", "Missing 'custom_id'.", number, "custom_id")
    if item.get("method") != "POST":
        return _error("invalid_value", "Only POST is supported.", number, "method")
    if item.get("url") != endpoint:
        return _error("mismatched_endpoint", f"The url must be {endpoint}.", number, "url")
    body = item.get("body")
    if not isinstance(body, dict):
        return _error("missing_required_parameter", "Missing 'body'.", number, "body")
    try:
        chat = parse_chat_request(json.dumps(body).encode("utf-8"))
    except ApiError as exc:
        return _error(exc.code or "invalid_request", exc.message, number, exc.param)
    user = last_user_text(chat)
    return BatchLine(
        custom_id,
        chat,
        prompt_tokens(chat),
        correlation_id_of(user) or custom_id,
        post_text_of(user),
    )


def parse_input_file(
    content: bytes, endpoint: str, max_lines: int
) -> tuple[list[BatchLine], list[dict[str, Any]]]:
    """Validated lines and validation errors (a batch with any error fails as a whole)."""
    lines: list[BatchLine] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    models: set[str] = set()
    raw_lines = [r for r in content.split(b"\n") if r.strip()]
    if not raw_lines:
        errors.append(_error("empty_file", "The input file has no requests.", 0))
    if len(raw_lines) > max_lines:
        errors.append(
            _error(
                "too_many_requests", f"A batch can hold at most {max_lines:,} requests.", max_lines
            )
        )
    for number, raw in enumerate(raw_lines, start=1):
        parsed = _parse_line(raw, number, endpoint)
        if isinstance(parsed, dict):
            errors.append(parsed)
        elif parsed.custom_id in seen:
            errors.append(
                _error("duplicate_custom_id", "The custom_id must be unique.", number, "custom_id")
            )
        else:
            seen.add(parsed.custom_id)
            models.add(parsed.chat.model)
            lines.append(parsed)
        if len(errors) >= _MAX_ERRORS:
            break
    if len(models) > 1:
        errors.append(_error("model_mismatch", "All requests must use the same model.", 0))
    return lines, errors


def answer_line(config: SimConfig, meter: Meter, line: BatchLine, batch_id: str) -> dict[str, Any]:
    """Run one request: an output line (billed) or an error line (free)."""
    attempt = meter.record_attempt(line.correlation_id)
    fault = decide_fault(config, line.correlation_id, attempt)
    request_id = new_request_id()
    model = line.chat.model
    error: ApiError | None = None
    if fault in _SERVER_SIDE:
        error = fault_error("500", model)
    elif fault == "429":
        error = fault_error("429", model)
    elif fault == "400":
        error = fault_error("400", model)
    if error is not None:
        response = {"status_code": error.status, "request_id": request_id, "body": error.body()}
        return _output_line(line.custom_id, response, None)
    content, finish_reason = answer_content(fault, line.correlation_id, line.post)
    completion = count_tokens(content)
    meter.bill(
        BilledCall(request_id, line.correlation_id, model, line.prompt, completion, batch_id)
    )
    body = completion_body(model, content, finish_reason, line.prompt, completion)
    return _output_line(
        line.custom_id, {"status_code": 200, "request_id": request_id, "body": body}, None
    )


def unfinished_line(custom_id: str, code: str) -> dict[str, Any]:
    """An error line for a request the batch never ran (expired or cancelled)."""
    return _output_line(custom_id, None, {"code": code, "message": _UNFINISHED_MESSAGES[code]})


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
