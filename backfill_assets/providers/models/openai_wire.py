"""OpenAI chat-completions wire format as the adapter needs it (pure, no I/O).

Request body, the response envelope (pydantic), Retry-After and rate-limit headers, and error
summaries that are safe to store: status, error type/code and a short message from which any
echo of the request (post text) and any secret has been removed.
"""

from __future__ import annotations

import email.utils
import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from backfill_assets.domain.caps import ERROR_CODE_CHARS
from backfill_assets.domain.money.prices import Tier, tier_served
from backfill_assets.domain.policy.label_probability import readable_logprob
from backfill_assets.domain.policy.output_gate import OutputContract
from backfill_assets.domain.ranges import MAX_CALL_TOKENS
from backfill_assets.providers.models.base import ModelRequest
from backfill_assets.providers.provider_text import safe_content_type, scrub
from backfill_assets.providers.ratelimit import AdvertisedLimits

SCHEMA_NAME = "moderation_output"
MAX_TOKENS_PARAMS = ("max_tokens", "max_completion_tokens")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_TRY_AGAIN = re.compile(r"try again in (\d+(?:\.\d+)?)\s*(ms|s)\b", re.IGNORECASE)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@functools.lru_cache(maxsize=16)
def _schema_of(contract: OutputContract) -> dict[str, Any]:
    # Built once per policy: every request of a run sends the same schema (a stable prefix).
    return contract.json_schema()


def request_body(
    request: ModelRequest,
    max_tokens_param: str,
    tier: Tier,
    logprobs: bool,
) -> dict[str, Any]:
    """One post of one tenant; strict JSON-schema output built from the rubric's contract.
    The flex tier is asked for with ``service_tier: "flex"``; standard sends no field (what a
    server without tiers expects). ``logprobs``: ask for the answer's token log-probabilities
    (``BACKFILL_LOGPROBS``), from which the label's probability is read."""
    if max_tokens_param not in MAX_TOKENS_PARAMS:
        raise ValueError(f"max_tokens_param must be one of {MAX_TOKENS_PARAMS}")
    asked: dict[str, Any] = {"service_tier": "flex"} if tier is Tier.FLEX else {}
    if logprobs:
        asked["logprobs"] = True
    return {
        **asked,
        "model": request.model,
        "messages": request.messages,
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": SCHEMA_NAME,
                "strict": True,
                "schema": _schema_of(request.contract),
            },
        },
        max_tokens_param: request.max_output_tokens,
        "temperature": 0,
    }


@dataclass(frozen=True, slots=True)
class BilledUsage:
    """What a provider billed for one call, in the shape it was reported.

    ``shape`` is ``split`` (prompt and completion known) or ``total`` (only the total is known:
    it is booked as ``tokens_in`` with ``tokens_out = 0``). No usage at all is ``None``: the
    caller books the call's upper bound instead, never 0.
    """

    tokens_in: int
    tokens_out: int
    shape: str
    # Of ``tokens_in``: read from the provider's prompt cache (billed cheaper), and written to
    # it (Anthropic-shaped usage: billed dearer).
    cached: int = 0
    cache_written: int = 0
    # Of ``tokens_out``: reasoning tokens (OpenAI's ``completion_tokens_details``).
    reasoning: int = 0

    @property
    def total(self) -> int:
        """Tokens billed."""
        return self.tokens_in + self.tokens_out


def _count(value: object) -> int | None:
    if isinstance(value, bool):
        return None  # JSON true is no token count
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    # Larger token counts are not a real provider's: treat them as unreadable.
    if isinstance(value, int) and 0 <= value < MAX_CALL_TOKENS:
        return value
    return None


def error_code(data: object) -> str | None:
    """``error.code`` of a parsed OpenAI-style error body (sync answers, Batch API answers and
    batch error lines alike), cut to ``ERROR_CODE_CHARS``; None if there is none."""
    error = data.get("error") if isinstance(data, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    if isinstance(code, bool) or not isinstance(code, str | int) or code == "":
        return None
    return str(code)[:ERROR_CODE_CHARS]


def billed_usage(raw: object) -> BilledUsage | None:
    """The billed figures of any usage shape real servers send; None if the total is unknowable.

    OpenAI sends prompt, completion and total tokens (plus ``*_details``); vLLM and Ollama send
    ``*_details: null``; some gateways send ``completion_tokens: null`` or ``total_tokens`` alone;
    Anthropic-style servers say ``input_tokens``/``output_tokens``. When a total larger than
    prompt + completion is given, the total is what was billed.
    """
    if not isinstance(raw, dict):
        return None
    prompt = _count(raw.get("prompt_tokens", raw.get("input_tokens")))
    completion = _count(raw.get("completion_tokens", raw.get("output_tokens")))
    total = _count(raw.get("total_tokens"))
    cached, written = _cache_counts(raw)
    if "prompt_tokens" not in raw and prompt is not None:
        # Anthropic-shaped: input_tokens leaves out what was read from or written to the cache.
        prompt += cached + written
    if prompt is not None:
        # Never more cached than prompt: a count the provider cannot mean is not trusted.
        cached, written = min(cached, prompt), min(written, prompt - min(cached, prompt))
    details = raw.get("completion_tokens_details")
    reasoning = _count(details.get("reasoning_tokens")) if isinstance(details, dict) else None
    if prompt is not None and completion is not None:
        billed = max(prompt + completion, total or 0)
        out = billed - prompt
        return BilledUsage(prompt, out, "split", cached, written, min(reasoning or 0, out))
    if prompt is not None and total is not None and total >= prompt:
        out = total - prompt
        return BilledUsage(prompt, out, "split", cached, written, min(reasoning or 0, out))
    if total is not None:
        return BilledUsage(total, 0, "total")
    return None


def _cache_counts(raw: dict[str, Any]) -> tuple[int, int]:
    """(read from cache, written to cache) of a usage object: OpenAI's
    ``prompt_tokens_details.cached_tokens``, or Anthropic's ``cache_read_input_tokens`` and
    ``cache_creation_input_tokens`` (sent through gateways)."""
    details = raw.get("prompt_tokens_details")
    read = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    if read is None:
        read = _count(raw.get("cache_read_input_tokens"))
    written = _count(raw.get("cache_creation_input_tokens"))
    return read or 0, written or 0


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    content: str | None = None


class _Choice(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    message: _Message
    finish_reason: str | None = None
    logprobs: Any = None  # kept raw: ``token_logprobs`` trusts none of it


class ChatCompletion(BaseModel):
    """The parts of a 200 answer we use; providers add fields freely, so extras are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str | None = None
    choices: list[_Choice] = Field(default_factory=list)
    # Kept raw: a usage shape we do not model must never make a paid answer unreadable.
    usage: Any = None
    # The tier that served the call (what is billed), whatever was asked for.
    service_tier: Any = None

    @property
    def served_tier(self) -> Tier:
        """The tier the provider says it billed (``core.prices.tier_served``)."""
        return tier_served(self.service_tier)

    @property
    def billed(self) -> BilledUsage | None:
        """The billed figures, whatever shape the usage came in (None: not reported)."""
        return billed_usage(self.usage)

    @property
    def logprobs(self) -> tuple[tuple[str, float], ...] | None:
        """The first choice's tokens and log-probabilities (``token_logprobs``)."""
        return token_logprobs(self.choices[0].logprobs) if self.choices else None

    @property
    def content(self) -> str:
        """The first choice's text ('' for a refusal or an empty answer: it fails parsing)."""
        if not self.choices:
            return ""
        return self.choices[0].message.content or ""


@dataclass(frozen=True, slots=True)
class Envelope:
    """What an adapter reads from a 2xx before booking it: the answer to store (its dialect's
    raw text), the response id, what was billed and at which tier, and where the answer was
    found when a server may put it in more than one field (safeguard)."""

    content: str
    id: str | None
    billed: BilledUsage | None
    served_tier: Tier = Tier.STANDARD
    answer_from: str = ""
    logprobs: tuple[tuple[str, float], ...] | None = None  # the answer's tokens, if sent


def token_logprobs(logprobs: object) -> tuple[tuple[str, float], ...] | None:
    """A choice's ``logprobs.content`` as (token, log-probability) pairs, all readable, or None."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content:
        return None
    out: list[tuple[str, float]] = []
    for entry in content:
        token = entry.get("token") if isinstance(entry, dict) else None
        lp = entry.get("logprob") if isinstance(entry, dict) else None
        readable = readable_logprob(lp)
        if not isinstance(token, str) or readable is None:
            return None
        out.append((token, readable))
    return tuple(out)


class NotACompletion(ValueError):
    """A 2xx whose body is not a chat completion at all (a proxy page, garbage)."""


def first_choice(body: bytes) -> tuple[dict[str, Any] | None, BilledUsage | None, str | None]:
    """A 2xx body's first choice (or None), usage and id; ``NotACompletion``: no JSON object."""
    data = loads_or_none(body)
    if not isinstance(data, dict):
        raise NotACompletion("2xx body is not a JSON object")
    rid = data.get("id") if isinstance(data.get("id"), str) else None
    choices = data.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    return (choice if isinstance(choice, dict) else None), billed_usage(data.get("usage")), rid


def loads_or_none(body: bytes | str) -> Any:
    """JSON from a provider, or None when it is not JSON a parser can hold: malformed, too
    deep, or a number past Python's 4,300-digit limit (a ``ValueError``, not a decode error)."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def parse_completion(body: bytes) -> ChatCompletion:
    """The envelope of a 2xx answer; the model's content is parsed later, by the output gate."""
    data = loads_or_none(body)
    if data is None:
        raise NotACompletion("2xx body is not JSON")
    if not isinstance(data, dict):
        raise NotACompletion("2xx body is not a JSON object")
    try:
        return ChatCompletion.model_validate(data)
    except ValidationError as exc:
        # Keep what was billed even if the rest is odd: usage alone is worth booking.
        usage = data.get("usage")
        if billed_usage(usage) is None:
            fields = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors()[:3])
            raise NotACompletion(f"2xx body is not a chat completion ({fields})") from None
        return ChatCompletion(
            id=data.get("id") if isinstance(data.get("id"), str) else None, usage=usage
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
    headers: Mapping[str, str],
    message: str = "",
    now: datetime | None = None,
    *,
    resets: bool = True,
) -> float | None:
    """When the provider says to retry, in seconds; None if it does not say.

    Order: ``retry-after-ms``, ``retry-after`` (seconds or an HTTP date, any size), then the
    ``x-ratelimit-reset-*`` of the exhausted limit (both if unclear), then "try again in Xs"
    in the error message. ``resets=False`` (for 5xx answers) skips the rate-limit resets: they
    describe the rate window, not the outage, and a 5xx must not park callers for minutes.
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
    if not resets:
        return None
    found: list[float] = []
    exhausted: list[float] = []
    for kind in ("requests", "tokens"):
        reset = parse_duration(headers.get(f"x-ratelimit-reset-{kind}", ""))
        if reset is None:
            continue
        found.append(reset)
        if _int_header(headers, f"x-ratelimit-remaining-{kind}") == 0:
            exhausted.append(reset)
    if exhausted or found:
        return max(exhausted or found)
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


def error_summary(
    status: int,
    body: bytes,
    content_type: str,
    echoes: Sequence[str] = (),
    secrets: Sequence[str] = (),
) -> tuple[str, str]:
    """``(summary, raw message)`` of an error answer; only the summary may be stored."""
    data = loads_or_none(body)
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, str):
        error = {"message": error}
    if not isinstance(error, dict):
        kind = safe_content_type(content_type)
        return f"HTTP {status}: non-JSON error body ({kind}, {len(body)} bytes)", ""
    message = str(error.get("message") or "")
    labels = [str(error[k])[:40] for k in ("type", "code") if error.get(k)]
    tag = "/".join(scrub(label, echoes, secrets) for label in labels)
    text = scrub(message, echoes, secrets)
    return f"HTTP {status}{' ' + tag if tag else ''}: {text}", message
