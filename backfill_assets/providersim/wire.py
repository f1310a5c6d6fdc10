"""OpenAI chat-completions wire format: request validation, error and completion bodies (pure).

Token accounting is deterministic so tests can predict bills exactly::

    prompt_tokens     = sum(count_tokens(message text) + 4 for each message)
    completion_tokens = count_tokens(assistant content)

where ``count_tokens`` is ``backfill_assets.providers.models.rules.count_tokens``. The
rate-limit charge of a request is
``prompt_tokens + (max_completion_tokens or max_tokens or default)``.

``logprobs`` (a boolean), ``top_logprobs`` (0 to 20, only with ``logprobs: true``) and
``reasoning_effort`` (``low``, ``medium`` or ``high``, what vLLM takes) are validated for every
model; only the guard dialects act on them (``guard_models/``).
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from backfill_assets.providers.models.rules import count_tokens

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_FORMATS = frozenset({"text", "json_object", "json_schema"})
_CID_PREFIX = "correlation_id:"
_POST_OPEN = "<post>\n"
_POST_CLOSE = "\n</post>"


def quoted(message: str, text: str) -> str:
    """``message`` quoting a request's ``text`` verbatim, as providers echo offending input."""
    return f"{message} Invalid content: '{text}'"


class ApiError(Exception):
    """An error answered with OpenAI's ``{"error": {...}}`` body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def quoting(self, text: str) -> ApiError:
        """A copy whose message quotes ``text`` verbatim, as providers echo offending input."""
        return ApiError(
            self.status,
            quoted(self.message, text),
            error_type=self.error_type,
            param=self.param,
            code=self.code,
            headers=self.headers,
        )

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message with its content flattened to text."""

    role: str
    text: str


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """The parts of a chat-completions request the simulator acts on."""

    model: str
    messages: tuple[ChatMessage, ...]
    max_tokens: int | None
    # ``response_format.json_schema.schema`` when one was sent: the answer keeps within it.
    response_schema: Any = None
    # What was asked for: 'flex', or 'default' (also for 'auto' and no field).
    service_tier: str = "default"
    # Log-probabilities asked for, and how many alternatives per token (0 to 20).
    logprobs: bool = False
    top_logprobs: int = 0
    # 'low', 'medium' or 'high' as sent (None: not sent); only safeguard models act on it.
    reasoning_effort: str | None = None


def _invalid(message: str, param: str | None, code: str | None = "invalid_type") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _message_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    # Content may also be a list of parts; only text parts carry tokens here.
    if isinstance(content, list) and all(isinstance(part, dict) for part in content):
        return "".join(str(part.get("text", "")) for part in content)
    raise _invalid(
        f"Invalid type for 'messages[{index}].content': expected a string or an array.",
        f"messages[{index}].content",
    )


def _parse_messages(raw: Any) -> tuple[ChatMessage, ...]:
    if raw is None:
        raise _invalid(
            "Missing required parameter: 'messages'.", "messages", "missing_required_parameter"
        )
    if not isinstance(raw, list) or not raw:
        raise _invalid("Invalid 'messages': expected a non-empty array.", "messages")
    out: list[ChatMessage] = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            raise _invalid(
                f"Invalid type for 'messages[{index}]': expected an object.", f"messages[{index}]"
            )
        role = item.get("role")
        if role not in _ROLES:
            raise _invalid(
                f"Invalid value for 'messages[{index}].role': {role!r}.",
                f"messages[{index}].role",
                "invalid_value",
            )
        out.append(ChatMessage(str(role), _message_text(item.get("content"), index)))
    return tuple(out)


def _parse_max_tokens(body: dict[str, Any]) -> int | None:
    for param in ("max_completion_tokens", "max_tokens"):
        value = body.get(param)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _invalid(f"Invalid '{param}': expected an integer >= 1.", param, "invalid_value")
        return value
    return None


_SERVICE_TIERS = frozenset({"auto", "default", "flex", "scale", "priority"})
# What vLLM's chat request accepts for reasoning_effort.
REASONING_EFFORTS: tuple[str, ...] = ("low", "medium", "high")
_MAX_TOP_LOGPROBS = 20


def check_temperature(body: dict[str, Any]) -> None:
    """400 unless ``temperature`` is absent or a number from 0 to 2."""
    temperature = body.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float)
        or not 0 <= temperature <= 2
    ):
        raise _invalid("Invalid 'temperature': expected a number from 0 to 2.", "temperature")


def _check_options(body: dict[str, Any]) -> None:
    check_temperature(body)
    fmt = body.get("response_format")
    if fmt is None:
        return
    if not isinstance(fmt, dict) or fmt.get("type") not in _FORMATS:
        raise _invalid("Invalid 'response_format.type'.", "response_format.type", "invalid_value")
    if fmt["type"] == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise _invalid(
                "Missing required parameter: 'response_format.json_schema.name'.",
                "response_format.json_schema.name",
                "missing_required_parameter",
            )


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object; ``ApiError`` (400) as the API words it."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise ApiError(
            400,
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly.)",
        ) from None
    if not isinstance(body, dict):
        raise _invalid("Invalid request body: expected a JSON object.", None)
    return body


def required_model(body: dict[str, Any]) -> str:
    """The body's ``model``: required, a non-empty string."""
    model = body.get("model")
    if model is None:
        raise _invalid(
            "Missing required parameter: 'model'.", "model", "missing_required_parameter"
        )
    if not isinstance(model, str) or not model:
        raise _invalid("Invalid 'model': expected a non-empty string.", "model")
    return model


def optional_int(body: dict[str, Any], param: str, low: int, high: int) -> int | None:
    """An optional integer parameter within ``[low, high]`` (null: absent)."""
    value = body.get(param)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _invalid(
            f"Invalid '{param}': expected an integer from {low} to {high}.", param, "invalid_value"
        )
    return value


def _parse_logprobs(body: dict[str, Any]) -> tuple[bool, int | None]:
    """``logprobs`` (a boolean) and ``top_logprobs`` (0 to 20, only with logprobs)."""
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise _invalid("Invalid type for 'logprobs': expected a boolean.", "logprobs")
    top = optional_int(body, "top_logprobs", 0, _MAX_TOP_LOGPROBS)
    if top is not None and logprobs is not True:
        raise _invalid(
            "Invalid value for 'top_logprobs': 'logprobs' must be set to true when "
            "'top_logprobs' is used.",
            "top_logprobs",
            "invalid_value",
        )
    return logprobs is True, top


def _parse_effort(body: dict[str, Any]) -> str | None:
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise _invalid(
            f"Invalid value for 'reasoning_effort': {effort!r}. Expected one of "
            f"{', '.join(REASONING_EFFORTS)}.",
            "reasoning_effort",
            "invalid_value",
        )
    return effort


def parse_chat_request(raw: bytes) -> ChatRequest:
    """Validate a request body the way the API does; raises ``ApiError`` (400) if invalid."""
    body = json_object(raw)
    model = required_model(body)
    messages = _parse_messages(body.get("messages"))
    max_tokens = _parse_max_tokens(body)
    _check_options(body)
    fmt = body.get("response_format")
    schema = fmt["json_schema"].get("schema") if fmt and fmt["type"] == "json_schema" else None
    tier = body.get("service_tier")
    if tier is not None and tier not in _SERVICE_TIERS:
        raise _invalid(
            f"Invalid value for 'service_tier': {tier!r}.", "service_tier", "invalid_value"
        )
    logprobs, top_logprobs = _parse_logprobs(body)
    return ChatRequest(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        response_schema=schema,
        service_tier="flex" if tier == "flex" else "default",
        logprobs=logprobs,
        top_logprobs=top_logprobs or 0,
        reasoning_effort=_parse_effort(body),
    )


def prompt_tokens(request: ChatRequest) -> int:
    """Deterministic prompt token count (see module docstring)."""
    return sum(count_tokens(message.text) + 4 for message in request.messages)


def last_user_text(request: ChatRequest) -> str:
    """Text of the last user message ('' if there is none)."""
    for message in reversed(request.messages):
        if message.role == "user":
            return message.text
    return ""


def user_text_in(body: Any) -> str | None:
    """Best effort, for echoing errors: the last user message of a body, even an invalid one."""
    if isinstance(body, bytes):
        try:
            body = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            return None
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return None
    for index in reversed(range(len(messages))):
        item = messages[index]
        if isinstance(item, dict) and item.get("role") == "user":
            try:
                return _message_text(item.get("content"), index)
            except ApiError:
                return None
    return None


def correlation_id_of(user_text: str) -> str:
    """The id on the ``correlation_id:`` line of the rubric's user message ('' if absent)."""
    for line in user_text.splitlines():
        if line.startswith(_CID_PREFIX):
            return line[len(_CID_PREFIX) :].strip()
    return ""


def post_text_of(user_text: str) -> str:
    """The post between ``<post>`` and ``</post>``; the whole message if not delimited."""
    start = user_text.find(_POST_OPEN)
    end = user_text.rfind(_POST_CLOSE)
    if start < 0 or end < start + len(_POST_OPEN):
        return user_text
    return user_text[start + len(_POST_OPEN) : end]


def new_request_id() -> str:
    """An ``x-request-id`` value."""
    return f"req_{secrets.token_hex(16)}"


def completion_body(
    model: str,
    content: str,
    finish_reason: str,
    usage: dict[str, Any] | None,
    service_tier: str = "default",
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A 200 body of ``POST /v1/chat/completions``; no ``usage`` key when ``usage`` is None."""
    body: dict[str, Any] = {
        "id": f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage,
        "service_tier": service_tier,
        "system_fingerprint": "fp_providersim",
    }
    if usage is None:
        del body["usage"]
    return body
