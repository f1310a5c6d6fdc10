"""gpt-oss-safeguard behind vLLM (harmony format, bring-your-own-policy): the answer (pure).

A ``POST /v1/chat/completions`` whose model name holds ``safeguard`` (any case)::

    {"model": M,
     "messages": [{"role": "system", "content": <policy>},
                  {"role": "user", "content": <post, framed as the chat-json dialect frames it>}],
     "reasoning_effort": "low" | "medium" | "high",
     "max_tokens" | "max_completion_tokens": N,
     "response_format": {"type": "json_schema", "json_schema": {..the chat-json schema..}}}

The final answer is the chat-json dialect's JSON object (``answers.answer_content``: label and
rules within the request's schema, the correlation id of the framed message), so content
faults (``malformed``, ``wrong_key``, ``unknown_label``, ``bad_confidence``) distort it as for
chat. The answer, as vLLM's ``--reasoning-parser openai_gptoss`` splits the harmony channels::

    choices[0].message = {"role": "assistant", "content": <final JSON text>, "refusal": null,
                          "reasoning_content": <analysis prose>}
    usage = {"prompt_tokens", "completion_tokens" (reasoning + final), "total_tokens",
             "completion_tokens_details": {"reasoning_tokens": R}}

``SimConfig.safeguard_reasoning_field`` names the analysis ``reasoning`` instead, as later vLLM
versions do. R is drawn from the post's text within the effort's range
(``REASONING_TOKENS_BY_EFFORT``: low 60-150, medium 200-500, high 600-1500; ``medium`` when
not sent) and the analysis is prose of exactly R tokens (``count_tokens``) that mentions the
policy's labels and ends naming the label it chose, with no JSON object in it. Completion
tokens are the reasoning's plus the content's. When they exceed the request's max tokens the
output is capped as a real server caps it: ``finish_reason: "length"``, content null, the
analysis cut at the cap, billed for exactly max tokens. The usage shape
(``usage_shape``) applies; its ``completion_tokens_details`` carry the true reasoning tokens
(``details_null`` keeps them null).

Switches (``SimConfig``, off by default; the first set wins, in this order):
``safeguard_content_null``: content null, the final JSON is the whole analysis;
``safeguard_answer_in_reasoning``: content null, the final JSON ends the analysis prose;
``safeguard_prose_only``: content null, the analysis prose alone (a label named, no JSON);
``safeguard_unenforced``: content is the JSON in a ```json fence or in prose (drawn per post).
``safeguard_no_reasoning_usage`` (with any of them): usage without
``completion_tokens_details``. Reasoning tokens are always ``count_tokens`` of the analysis
shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backfill_assets.providers.models.rules import count_tokens, judge
from backfill_assets.providersim.answers import answer_content, contract_of
from backfill_assets.providersim.billing.usage import usage_body
from backfill_assets.providersim.config import FaultKind, SimConfig, UsageShape
from backfill_assets.providersim.faults import unit_draw
from backfill_assets.providersim.wire import ChatRequest, completion_body

# Reasoning tokens per effort, inclusive ranges; gpt-oss reasons at 'medium' unless told.
REASONING_TOKENS_BY_EFFORT: dict[str, tuple[int, int]] = {
    "low": (60, 150),
    "medium": (200, 500),
    "high": (600, 1500),
}
DEFAULT_EFFORT = "medium"
_MARKER = "safeguard"
# count_tokens counts about four characters a token: prose of 4R characters is R tokens.
_CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class SafeguardAnswer:
    """What the model generated, as the server splits and counts it."""

    content: str | None
    reasoning: str
    reasoning_tokens: int
    completion_tokens: int
    finish_reason: str


def is_safeguard_model(model: str) -> bool:
    """Whether a chat request is for gpt-oss-safeguard (its model name holds 'safeguard')."""
    return _MARKER in model.lower()


def reasoning_tokens(post: str, effort: str | None) -> int:
    """R: drawn from the post's text within the effort's range."""
    low, high = REASONING_TOKENS_BY_EFFORT[effort or DEFAULT_EFFORT]
    return low + int(unit_draw("safeguard-reasoning", post) * (high - low + 1))


def _sentence(index: int, labels: tuple[str, ...]) -> str:
    label = labels[index % len(labels)]
    sentences = (
        "We need to classify the post under the policy in the system message.",
        f"Could the label be {label}? Check the policy's rules for {label} against the post.",
        "The answer must give schema_version, correlation_id, label, rule_ids and confidence.",
        f"The wording does not settle {label} on its own, so read the post once more.",
    )
    return sentences[index % len(sentences)] + " "


def reasoning_prose(labels: tuple[str, ...], label: str, tokens: int) -> str:
    """Analysis prose of exactly ``tokens`` tokens that mentions ``labels`` and ends naming
    ``label``; no braces, so no JSON object in it."""
    conclusion = f" So the label is {label}."
    room = max(0, tokens * _CHARS_PER_TOKEN - len(conclusion))
    parts: list[str] = []
    filled = 0
    while filled < room:
        parts.append(_sentence(len(parts), labels or (label,)))
        filled += len(parts[-1])
    # Cut at a word, trailing off in dots to the exact length.
    filler = "".join(parts)[: room + 1].rsplit(" ", 1)[0] if room else ""
    return filler.ljust(room, ".") + conclusion


def _unenforced(final: str, post: str) -> str:
    if unit_draw("safeguard-unenforced", post) < 0.5:
        return f"```json\n{final}\n```"
    return f"Here is my assessment of the post under the policy:\n{final}\nI hope this helps."


def _shown(final: str, prose: str, post: str, config: SimConfig) -> tuple[str | None, str]:
    """(content, reasoning) as the switches have the server send them."""
    if config.safeguard_content_null:
        return None, final
    if config.safeguard_answer_in_reasoning:
        return None, f"{prose}\n\n{final}"
    if config.safeguard_prose_only:
        return None, prose
    if config.safeguard_unenforced:
        return _unenforced(final, post), prose
    return final, prose


def safeguard_answer(
    chat: ChatRequest,
    correlation_id: str,
    post: str,
    fault: FaultKind | None,
    config: SimConfig,
) -> SafeguardAnswer:
    """The answer to ``chat`` (module docstring), capped at its max tokens."""
    final, finish_reason = answer_content(fault, correlation_id, post, chat.response_schema)
    contract = contract_of(chat.response_schema)
    label, _rules, _confidence = judge(post, contract)
    prose = reasoning_prose(contract.labels, label, reasoning_tokens(post, chat.reasoning_effort))
    content, reasoning = _shown(final, prose, post, config)
    thought = count_tokens(reasoning) if reasoning else 0
    completion = thought + (count_tokens(content) if content is not None else 0)
    cap = chat.max_tokens
    if cap is not None and completion > cap:
        kept = min(thought, cap)
        return SafeguardAnswer(None, reasoning[: kept * _CHARS_PER_TOKEN], kept, cap, "length")
    return SafeguardAnswer(content, reasoning, thought, completion, finish_reason)


def safeguard_usage(
    shape: UsageShape, prompt: int, answer: SafeguardAnswer, cached: int, config: SimConfig
) -> dict[str, Any] | None:
    """``usage`` in ``shape`` with the answer's true reasoning tokens (module docstring)."""
    usage = usage_body(shape, prompt, answer.completion_tokens, cached)
    if usage is None or "completion_tokens" not in usage:
        return usage
    if config.safeguard_no_reasoning_usage:
        usage.pop("completion_tokens_details", None)
        return usage
    if "completion_tokens_details" in usage and usage["completion_tokens_details"] is None:
        return usage  # details_null: the server sends none
    details = usage.get("completion_tokens_details") or {}
    usage["completion_tokens_details"] = {**details, "reasoning_tokens": answer.reasoning_tokens}
    return usage


def safeguard_body(
    model: str,
    answer: SafeguardAnswer,
    usage: dict[str, Any] | None,
    service_tier: str,
    reasoning_field: str,
) -> dict[str, Any]:
    """A 200 chat completion whose message holds content and analysis apart."""
    body = completion_body(model, "", answer.finish_reason, usage, service_tier)
    body["choices"][0]["message"] = {
        "role": "assistant",
        "content": answer.content,
        "refusal": None,
        reasoning_field: answer.reasoning,
    }
    return body
