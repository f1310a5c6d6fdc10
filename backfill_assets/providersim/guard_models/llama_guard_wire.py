"""vLLM's wire for Llama Guard: the ``/v1/completions`` request, tokens, logprobs and both
answer bodies (pure). What the model answers is ``llama_guard.py``'s.

``POST /v1/completions`` (OpenAI's legacy completions API, which vLLM serves)::

    {"model": M, "prompt": <rendered Llama Guard prompt>, "max_tokens": 20, "temperature": 0,
     "logprobs": 2}

``prompt`` must be one string; ``logprobs`` is absent/null or 0 to 20 alternatives per token.
The answer::

    {"id": "cmpl-<32 hex>", "object": "text_completion", "created": int, "model": M,
     "choices": [{"index": 0, "text": "unsafe\\nS2", "finish_reason": "stop",
                  "stop_reason": null,
                  "logprobs": {"tokens": [..], "token_logprobs": [..],
                               "top_logprobs": [{token: logprob, ..}, ..],
                               "text_offset": [..]}}],
     "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}

On ``POST /v1/chat/completions`` the answer is a chat completion whose
``choices[0].logprobs`` is ``{"content": [{"token", "logprob", "bytes", "top_logprobs":
[{"token", "logprob", "bytes"}, ..]}, ..]}`` (OpenAI's chat shape) when the request set
``logprobs: true`` (``top_logprobs`` alternatives each), else null, as vLLM sends it.

Tokens: the answer split simply: each newline, each run of other whitespace, each comma and
each word (``safe``/``unsafe``, a code) is a token; the completion tokens billed are their
number. The assessment's token (the first ``safe``/``unsafe`` in any case) carries the assessment's
log-probability and, as alternatives, both assessments (their probabilities sum to less than 1);
every other token is near-certain (p >= 0.98). A ``max_tokens`` below the answer's tokens cuts
it there, with ``finish_reason: "length"``. Under a legacy request, ``top_logprobs`` holds at
least the sampled token, as vLLM's does.
"""

from __future__ import annotations

import math
import re
import secrets
import time
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from backfill_assets.providersim.config import FaultKind
from backfill_assets.providersim.faults import unit_draw
from backfill_assets.providersim.guard_models.llama_guard import (
    assessment_probability,
    bad_logprob,
    guard_text_in,
)
from backfill_assets.providersim.wire import (
    ApiError,
    check_temperature,
    completion_body,
    json_object,
    optional_int,
    required_model,
)

_TOKEN = re.compile(r"\n|[^\S\n]+|,|[^\s,]+")
_OTHER_ASSESSMENT = {"safe": "unsafe", "unsafe": "safe"}
_SURE_LOW, _SURE_SPAN = 0.98, 0.0199
# The runner-up gets this share of what the sampled token leaves: the two sum to below 1.
_RUNNER_UP_SHARE = 0.9
_MAX_LOGPROBS = 20
_MAX_TOKENS_LIMIT = 1 << 20


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """The parts of a ``/v1/completions`` request the simulator acts on."""

    model: str
    prompt: str
    max_tokens: int | None
    # Alternatives per token asked for (None: no logprobs).
    logprobs: int | None


@dataclass(frozen=True, slots=True)
class GuardToken:
    """One generated token, its log-probability and the most likely tokens at its place
    (most likely first: the sampled token, then the runner-up)."""

    text: str
    logprob: float
    top: tuple[tuple[str, float], ...]


def parse_completion_request(raw: bytes) -> CompletionRequest:
    """Validate a ``/v1/completions`` body; raises ``ApiError`` (400) if invalid."""
    body = json_object(raw)
    model = required_model(body)
    prompt = body.get("prompt")
    if prompt is None:
        raise ApiError(
            400,
            "Missing required parameter: 'prompt'.",
            param="prompt",
            code="missing_required_parameter",
        )
    if not isinstance(prompt, str):
        raise ApiError(
            400,
            "Invalid type for 'prompt': this simulator takes one string.",
            param="prompt",
            code="invalid_type",
        )
    max_tokens = optional_int(body, "max_tokens", 1, _MAX_TOKENS_LIMIT)
    logprobs = optional_int(body, "logprobs", 0, _MAX_LOGPROBS)
    check_temperature(body)
    return CompletionRequest(model, prompt, max_tokens, logprobs)


def completion_text_in(body: Any) -> str | None:
    """Best effort, for echoing errors: the post of a body's prompt (else the prompt)."""
    try:
        return guard_text_in(json_object(body).get("prompt"))
    except ApiError:
        return None


def _log(p: float) -> float:
    return round(math.log(p), 6)


def _other_assessment(token: str) -> str:
    """The other assessment, written as ``token`` is (lower, capitalised or upper case)."""
    other = _OTHER_ASSESSMENT[token.lower()]
    if token.isupper():
        return other.upper()
    return other.capitalize() if token[:1].isupper() else other


def guard_tokens(text: str, post: str, fault: FaultKind | None = None) -> tuple[GuardToken, ...]:
    """``text`` as generated tokens with their log-probabilities (module docstring); under
    ``bad_confidence`` the assessment's log-probability is above 0."""
    tokens: list[GuardToken] = []
    assessment_done = False
    for index, piece in enumerate(_TOKEN.findall(text)):
        if not assessment_done and piece.lower() in _OTHER_ASSESSMENT:
            assessment_done = True
            p, other = assessment_probability(post), _other_assessment(piece)
            logprob = round(bad_logprob(), 6) if fault == "bad_confidence" else _log(p)
        else:
            p = _SURE_LOW + _SURE_SPAN * unit_draw("guard-token", post, index)
            other, logprob = ("," if piece == "\n" else "\n"), _log(p)
        runner_up = _log((1.0 - p) * _RUNNER_UP_SHARE)
        tokens.append(GuardToken(piece, logprob, ((piece, logprob), (other, runner_up))))
    return tuple(tokens)


def capped(
    tokens: tuple[GuardToken, ...], max_tokens: int | None
) -> tuple[tuple[GuardToken, ...], str]:
    """The tokens a ``max_tokens`` cap lets through, and the finish reason."""
    if max_tokens is not None and len(tokens) > max_tokens:
        return tokens[:max_tokens], "length"
    return tokens, "stop"


def _joined(tokens: tuple[GuardToken, ...]) -> str:
    return "".join(token.text for token in tokens)


def chat_logprobs(tokens: tuple[GuardToken, ...], top_n: int) -> dict[str, Any]:
    """``choices[0].logprobs`` of a chat completion, ``top_n`` alternatives a token."""
    return {
        "content": [
            {
                "token": token.text,
                "logprob": token.logprob,
                "bytes": list(token.text.encode("utf-8")),
                "top_logprobs": [
                    {"token": alt, "logprob": lp, "bytes": list(alt.encode("utf-8"))}
                    for alt, lp in token.top[:top_n]
                ],
            }
            for token in tokens
        ]
    }


def completion_logprobs(tokens: tuple[GuardToken, ...], top_n: int) -> dict[str, Any]:
    """``choices[0].logprobs`` of a legacy completion (offsets within the completion)."""
    offsets = [0, *accumulate(len(token.text) for token in tokens)][: len(tokens)]
    return {
        "tokens": [token.text for token in tokens],
        "token_logprobs": [token.logprob for token in tokens],
        "top_logprobs": [dict(token.top[: max(top_n, 1)]) for token in tokens],
        "text_offset": offsets,
    }


def guard_chat_body(
    model: str,
    tokens: tuple[GuardToken, ...],
    finish_reason: str,
    usage: dict[str, Any] | None,
    top_logprobs: int | None,
    *,
    no_choice: bool = False,
) -> dict[str, Any]:
    """A chat completion of Llama Guard; ``top_logprobs`` None: no logprobs asked for;
    ``no_choice``: ``choices`` is empty (the ``wrong_key`` fault)."""
    logprobs = None if top_logprobs is None else chat_logprobs(tokens, top_logprobs)
    body = completion_body(model, _joined(tokens), finish_reason, usage, logprobs=logprobs)
    if no_choice:
        body["choices"] = []
    return body


def text_completion_body(
    model: str,
    tokens: tuple[GuardToken, ...],
    finish_reason: str,
    usage: dict[str, Any] | None,
    logprobs: int | None,
    *,
    no_choice: bool = False,
) -> dict[str, Any]:
    """A 200 body of ``POST /v1/completions``; no ``usage`` key when ``usage`` is None."""
    choice = {
        "index": 0,
        "text": _joined(tokens),
        "logprobs": None if logprobs is None else completion_logprobs(tokens, logprobs),
        "finish_reason": finish_reason,
        "stop_reason": None,
    }
    body: dict[str, Any] = {
        "id": f"cmpl-{secrets.token_hex(16)}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [] if no_choice else [choice],
        "usage": usage,
    }
    if usage is None:
        del body["usage"]
    return body
