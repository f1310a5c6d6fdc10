"""Llama Guard behind vLLM, the wire as the adapter needs it (pure).

Two requests, both OpenAI-compatible:

- the model's chat template (built-in categories): ``POST /chat/completions`` with the post as
  the one user message, ``logprobs: true, top_logprobs: 2``; the answer is
  ``choices[0].message.content`` and its tokens' log-probabilities are
  ``choices[0].logprobs.content[i].logprob`` (OpenAI's chat shape);
- a raw prompt (the policy's own categories): ``POST /completions`` with ``prompt`` and
  ``logprobs: 2``; the answer is ``choices[0].text`` and the log-probabilities are
  ``choices[0].logprobs.token_logprobs[i]`` beside ``tokens[i]`` (the legacy completions shape).

The assessment's probability is the first generated token that is not whitespace (``safe`` or
``unsafe``; a template may make the model open with a newline). A server that sends no
log-probabilities, or unreadable ones, gives none: never an invented number.
"""

from __future__ import annotations

from typing import Any

from backfill_assets.domain.policy.dialects.llama_guard import GuardAnswer
from backfill_assets.domain.policy.label_probability import readable_logprob
from backfill_assets.providers.models.base import ModelRequest
from backfill_assets.providers.models.openai_wire import (
    Envelope,
    NotACompletion,
    first_choice,
)

CHAT_PATH = "/chat/completions"
COMPLETIONS_PATH = "/completions"
# Where the post sits in a rendered prompt (``domain/policy/llama_guard.render_prompt``).
_POST_START = "<BEGIN CONVERSATION>\n\nUser: "
_POST_END = "\n\n<END CONVERSATION>"
# Two alternatives are enough to read the assessment's probability (safe against unsafe).
TOP_LOGPROBS = 2


def guard_body(request: ModelRequest, max_tokens_param: str, raw_prompt: bool) -> dict[str, Any]:
    """The request for one post: its raw prompt to ``/completions``, or its chat messages."""
    if raw_prompt:
        return {
            "model": request.model,
            "prompt": request.messages[0]["content"],
            # The legacy completions API has one name for the cap.
            "max_tokens": request.max_output_tokens,
            "temperature": 0,
            "logprobs": TOP_LOGPROBS,
        }
    return {
        "model": request.model,
        "messages": request.messages,
        max_tokens_param: request.max_output_tokens,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": TOP_LOGPROBS,
    }


def _first_word(pairs: list[tuple[object, object]]) -> float | None:
    """The log-probability of the first token that is not whitespace."""
    for token, lp in pairs:
        if isinstance(token, str) and token.strip():
            return readable_logprob(lp)
        if not isinstance(token, str):
            return None
    return None


def _chat_logprob(choice: dict[str, Any]) -> float | None:
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return None
    return _first_word(
        [
            (t.get("token"), t.get("logprob")) if isinstance(t, dict) else (None, None)
            for t in content
        ]
    )


def _completion_logprob(choice: dict[str, Any]) -> float | None:
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    tokens, lps = logprobs.get("tokens"), logprobs.get("token_logprobs")
    if not isinstance(tokens, list) or not isinstance(lps, list) or len(tokens) != len(lps):
        return None
    return _first_word(list(zip(tokens, lps, strict=True)))


def guard_answer(body: bytes, raw_prompt: bool) -> Envelope:
    """The answer of a 2xx as stored (``GuardAnswer``: its text and the assessment's
    log-probability), with its id and usage; ``NotACompletion`` when it is no answer of that
    API at all (a body that still says what was billed is booked, then refused)."""
    choice, billed, rid = first_choice(body)
    if choice is None:
        if billed is not None:
            return Envelope(GuardAnswer("").to_raw(), rid, billed)
        raise NotACompletion("2xx body has no choices")
    if raw_prompt:
        text, lp = choice.get("text"), _completion_logprob(choice)
    else:
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else None
        lp = _chat_logprob(choice)
    answer = GuardAnswer(text if isinstance(text, str) else "", lp)
    return Envelope(answer.to_raw(), rid, billed)


def post_in_prompt(prompt: str) -> str | None:
    """The post inside a rendered prompt (what a server might echo back in an error)."""
    start = prompt.find(_POST_START)
    end = prompt.rfind(_POST_END)
    if start == -1 or end < start:
        return None
    return prompt[start + len(_POST_START) : end] or None
