"""OpenAI chat-completions wire format as the adapter needs it (pure, no I/O).

Request body, the response envelope (pydantic), Retry-After and rate-limit headers, and error
summaries that are safe to store: status, error type/code and a short message from which any
echo of the request (post text) and any secret has been removed.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..ratelimit import AdvertisedLimits
from ..rubric import output_json_schema
from .base import ModelRequest

SCHEMA_NAME = "moderation_output"
MAX_TOKENS_PARAMS = ("max_tokens", "max_completion_tokens")
_MESSAGE_CHARS = 160
# A run of this many characters shared with the request means the provider echoed it.
_ECHO_WINDOW = 16
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_TRY_AGAIN = re.compile(r"try again in (\d+(?:\.\d+)?)\s*(ms|s)\b", re.IGNORECASE)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def request_body(request: ModelRequest, max_tokens_param: str = "max_tokens") -> dict[str, Any]:
    """One post of one tenant; strict JSON-schema output built from the rubric's contract."""
    if max_tokens_param not in MAX_TOKENS_PARAMS:
        raise ValueError(f"max_tokens_param must be one of {MAX_TOKENS_PARAMS}")
    return {
        "model": request.model,
        "messages": request.messages,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": SCHEMA_NAME, "strict": True, "schema": output_json_schema()},
        },
        max_tokens_param: request.max_output_tokens,
        "temperature": 0,
    }


class Usage(BaseModel):
    """Tokens the provider billed."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    content: str | None = None


class _Choice(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    message: _Message
    finish_reason: str | None = None


class ChatCompletion(BaseModel):
    """The parts of a 200 answer we use; providers add fields freely, so extras are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str | None = None
    choices: list[_Choice] = Field(default_factory=list)
    usage: Usage | None = None

    @property
    def content(self) -> str:
        """The first choice's text ('' for a refusal or an empty answer: it fails parsing)."""
        if not self.choices:
            return ""
        return self.choices[0].message.content or ""


class NotACompletion(ValueError):
    """A 2xx whose body is not a chat completion at all (a proxy page, garbage)."""


def parse_completion(body: bytes) -> ChatCompletion:
    """The envelope of a 2xx answer; the model's content is parsed later, by the rubric."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise NotACompletion("2xx body is not JSON") from None
    if not isinstance(data, dict):
        raise NotACompletion("2xx body is not a JSON object")
    try:
        return ChatCompletion.model_validate(data)
    except ValidationError as exc:
        # Keep what was billed even if the rest is odd: usage alone is worth booking.
        usage = data.get("usage")
        try:
            billed = Usage.model_validate(usage) if isinstance(usage, dict) else None
        except ValidationError:
            billed = None
        if billed is None:
            fields = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors()[:3])
            raise NotACompletion(f"2xx body is not a chat completion ({fields})") from None
        return ChatCompletion(
            id=data.get("id") if isinstance(data.get("id"), str) else None, usage=billed
        )


def parse_duration(text: str) -> float | None:
    """``20ms``, ``1.5s``, ``6m0s``, ``1h2m3s`` or plain seconds -> seconds (None if unreadable)."""
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        return value if math.isfinite(value) and value >= 0 else None
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            return None
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    return total if pos == len(text) and pos > 0 else None


def _retry_after_header(value: str, now: datetime) -> float | None:
    seconds = parse_duration(value) if value.strip().replace(".", "", 1).isdigit() else None
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def _int_header(headers: Mapping[str, str], name: str) -> int | None:
    raw = headers.get(name, "").strip()
    return int(raw) if raw.isdigit() else None


def retry_after_seconds(
    headers: Mapping[str, str], message: str = "", now: datetime | None = None
) -> float | None:
    """When the provider says to retry, in seconds; None if it does not say.

    Order: ``retry-after-ms``, ``retry-after`` (seconds or an HTTP date, any size), then the
    ``x-ratelimit-reset-*`` of the exhausted limit (both if unclear), then "try again in Xs"
    in the error message.
    """
    ms = headers.get("retry-after-ms", "").strip()
    if ms:
        value = parse_duration(ms)
        if value is not None:
            return value / 1000.0
    after = headers.get("retry-after", "")
    if after.strip():
        value = _retry_after_header(after, now or datetime.now(UTC))
        if value is not None:
            return value
    resets: list[float] = []
    exhausted: list[float] = []
    for kind in ("requests", "tokens"):
        reset = parse_duration(headers.get(f"x-ratelimit-reset-{kind}", ""))
        if reset is None:
            continue
        resets.append(reset)
        if _int_header(headers, f"x-ratelimit-remaining-{kind}") == 0:
            exhausted.append(reset)
    if exhausted or resets:
        return max(exhausted or resets)
    match = _TRY_AGAIN.search(message)
    if match:
        return float(match.group(1)) * _UNITS[match.group(2).lower()]
    return None


def advertised_limits(headers: Mapping[str, str]) -> AdvertisedLimits | None:
    """``x-ratelimit-limit-requests`` / ``-tokens``, when the provider sends them."""
    requests = _int_header(headers, "x-ratelimit-limit-requests")
    tokens = _int_header(headers, "x-ratelimit-limit-tokens")
    if requests is None and tokens is None:
        return None
    return AdvertisedLimits(requests or None, tokens or None)


def _echoes(message: str, texts: Iterable[str]) -> bool:
    for text in texts:
        if len(text) >= _ECHO_WINDOW:
            if any(
                message[i : i + _ECHO_WINDOW] in text
                for i in range(len(message) - _ECHO_WINDOW + 1)
            ):
                return True
        elif len(text) >= 4 and text in message:
            return True
    return False


def scrub(message: str, echoes: Sequence[str], secrets: Sequence[str]) -> str:
    """A provider message safe to store: no quoted values, no echo of the request, no secret."""
    text = _CONTROL.sub(" ", message)
    text = _QUOTED.sub("'…'", text)
    text = text[:_MESSAGE_CHARS]
    if _echoes(text, echoes) or any(s and s in message for s in secrets):
        return "(message withheld: it echoed the request)"
    return text


def error_summary(
    status: int,
    body: bytes,
    content_type: str,
    echoes: Sequence[str] = (),
    secrets: Sequence[str] = (),
) -> tuple[str, str]:
    """``(summary, raw message)`` of an error answer; only the summary may be stored."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, str):
        error = {"message": error}
    if not isinstance(error, dict):
        kind = content_type.split(";")[0].strip() or "unknown type"
        return f"HTTP {status}: non-JSON error body ({kind}, {len(body)} bytes)", ""
    message = str(error.get("message") or "")
    labels = [str(error[k])[:40] for k in ("type", "code") if error.get(k)]
    tag = "/".join(scrub(label, echoes, secrets) for label in labels)
    text = scrub(message, echoes, secrets)
    return f"HTTP {status}{' ' + tag if tag else ''}: {text}", message
