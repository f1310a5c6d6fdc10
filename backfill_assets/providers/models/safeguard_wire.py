"""gpt-oss-safeguard behind vLLM, the answer as the adapter reads it (pure).

The model reasons in its analysis channel and answers in its final channel; vLLM's reasoning
parser returns them as ``message.reasoning_content`` (``message.reasoning`` in newer releases)
and ``message.content``. Its known faults: ``content`` null with the whole answer in the
reasoning field, the final JSON object at the end of the reasoning text, and structured output
not enforced (the answer in prose or a code fence). The answer is taken, in this order, from:

1. ``content`` (``content``): the JSON object it is, or the last one inside it;
2. the reasoning field when it is a JSON object as a whole (``reasoning_content``);
3. the last JSON object in the reasoning text (``reasoning_json``).

Never from reasoning prose: with no JSON object anywhere, the answer is empty (``none``) and the
output gate refuses it. Which one it was is recorded on the call's ledger event.
"""

from __future__ import annotations

import json
from typing import Any

from backfill_assets.domain.policy.output_gate import MAX_ANSWER_CHARS
from backfill_assets.providers.models.openai_wire import (
    Envelope,
    NotACompletion,
    first_choice,
    loads_or_none,
)

REASONING_FIELDS = ("reasoning_content", "reasoning")
# Only the tail of a long text can hold its last answer (the gate refuses a longer one).
_TAIL_CHARS = 4 * MAX_ANSWER_CHARS
_DECODER = json.JSONDecoder()


def last_json_object(text: str) -> str | None:
    """The last top-level JSON object in ``text`` (as written), or None."""
    tail = text[-_TAIL_CHARS:]
    found: str | None = None
    i = tail.find("{")
    while i != -1:
        try:
            value, end = _DECODER.raw_decode(tail, i)
        except (ValueError, RecursionError):
            i = tail.find("{", i + 1)
            continue
        if isinstance(value, dict):
            found = tail[i:end]
        i = tail.find("{", end)
    return found


def _whole_object(text: str) -> str | None:
    stripped = text.strip()
    return stripped if isinstance(loads_or_none(stripped), dict) else None


def chosen_answer(message: dict[str, Any]) -> tuple[str, str]:
    """(answer text, where it was found) of a chat message from the server."""
    content = message.get("content")
    if isinstance(content, str) and content.strip():
        return _whole_object(content) or last_json_object(content) or content, "content"
    reasoning = next(
        (r for f in REASONING_FIELDS if isinstance(r := message.get(f), str) and r.strip()), None
    )
    if reasoning is None:
        return "", "none"
    whole = _whole_object(reasoning)
    if whole is not None:
        return whole, "reasoning_content"
    last = last_json_object(reasoning)
    if last is not None:
        return last, "reasoning_json"
    return "", "none"


def safeguard_answer(body: bytes) -> Envelope:
    """The answer of a 2xx with its id and usage; ``NotACompletion`` when it is no chat
    completion at all (a body that still says what was billed is booked, then refused)."""
    choice, billed, rid = first_choice(body)
    message = choice.get("message") if choice is not None else None
    if not isinstance(message, dict):
        if billed is not None:
            return Envelope("", rid, billed, answer_from="none")
        raise NotACompletion("2xx body is not a chat completion (choices[0].message)")
    text, where = chosen_answer(message)
    return Envelope(text, rid, billed, answer_from=where)
