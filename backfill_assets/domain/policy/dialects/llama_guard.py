"""The ``llama-guard`` dialect: Llama Guard 3/4's prompt and its answer, read onto the
platform's policy (pure).

Two ways to ask, chosen by the policy:

- with a ``dialects: llama-guard: categories:`` section, the model's own chat template asks
  about its built-in categories ``S1``..``S14`` (the post goes alone as the user message of
  ``/chat/completions``) and the section says which rule each stands for;
- without one, the policy's rules are the categories ``S1``..``Sn`` in file order, rendered
  with their descriptions into Meta's prompt format, sent raw to ``/completions``.

The answer is read as Meta's reference shield reads it (llama-stack's ``LlamaGuardShield``):
surrounding whitespace is stripped; ``safe`` exactly is safe; otherwise it must be ``unsafe``,
a newline and one line of comma-separated codes (each stripped). Anything else (another case,
no codes, a third line) is no assessment, and a code that is not a category of the prompt is
refused naming it: both ``schema_rejected`` dead letters. An unsafe answer takes the label of
the first listed code's rule and the rules of that label among the listed codes (a label names
only its own rules: the output contract); codes the section does not map are ignored, and an
answer listing only those is the policy's ``none`` label.

``confidence`` and the label's probability come from the first generated token (``safe`` or
``unsafe``) when the server returned its log-probability; without it the confidence is 1.0
(the model states none) and the probability is unknown (None).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from backfill_assets.domain.policy.dialect_sections import GUARD_CODES, LLAMA_GUARD_CATEGORIES
from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.policy.label_probability import readable_logprob
from backfill_assets.domain.policy.output_gate import (
    ModerationOutput,
    OutputContract,
    OutputRejected,
)

# The prompt format's special tokens, by Llama Guard version (``BACKFILL_LLAMA_GUARD_VERSION``).
# The server adds the begin-of-text token itself (vLLM's completions do by default).
_HEADERS = {
    "3": (
        "<|start_header_id|>user<|end_header_id|>\n\n",
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
    "4": (
        "<|header_start|>user<|header_end|>\n\n",
        "<|eot|><|header_start|>assistant<|header_end|>\n\n",
    ),
}
_TASK = (
    "Task: Check if there is unsafe content in 'User' messages in conversations according our "
    "safety policy with the below categories.\n\n"
)
_INSTRUCTIONS = (
    "Provide your safety assessment for ONLY THE LAST User message in the above conversation:\n"
    " - First line must read 'safe' or 'unsafe'.\n"
    " - If unsafe, a second line must include a comma-separated list of violated categories."
)
# What a post may not carry into the prompt: a special token (the server would read ``<|...|>``
# as one) or the frame's own markers. Their ``<`` is spaced out: the text reads the same.
_FRAME_BREAKERS = re.compile(r"<(?=\||\s*(?:BEGIN|END) (?:CONVERSATION|UNSAFE CONTENT))")
# The reference parser's pattern: ``unsafe``, one newline, one line (no third).
_UNSAFE = re.compile(r"unsafe\n([^\n]*)")
_CODE = re.compile(r"S[0-9]{1,4}")
# An answer is an assessment and a few codes; anything far longer is not one.
_MAX_ANSWER_CHARS = 4096


def neutral(text: str) -> str:
    """The post as it goes into the conversation: unable to close its frame or to smuggle in
    a special token."""
    return _FRAME_BREAKERS.sub("< ", text)


def categories_block(policy: Policy) -> str:
    """The policy's rules as Llama Guard categories, ``S<i>: <rule id>.`` then the rule's
    description (Meta's custom-category format)."""
    lines = []
    for i, rule in enumerate(policy.doc.rules, start=1):
        lines.append(f"S{i}: {rule.id}.")
        lines.append(rule.description.strip())
    return "\n".join(lines)


def builtin_categories_block() -> str:
    """The built-in categories as the models' chat templates list them."""
    return "\n".join(
        f"{code}: {name}." for code, name in zip(GUARD_CODES, LLAMA_GUARD_CATEGORIES, strict=True)
    )


def render_prompt(categories: str, text: str, version: str) -> str:
    """Meta's Llama Guard prompt for one post under ``categories`` (``/completions``)."""
    head, tail = _HEADERS[version]
    return (
        f"{head}{_TASK}<BEGIN UNSAFE CONTENT CATEGORIES>\n{categories}\n"
        "<END UNSAFE CONTENT CATEGORIES>\n\n<BEGIN CONVERSATION>\n\n"
        f"User: {neutral(text)}\n\n<END CONVERSATION>\n\n{_INSTRUCTIONS}{tail}"
    )


def template_bytes(version: str) -> int:
    """Bytes the model's own chat template adds around a post (built-in categories): counted
    in a call's token bound, as the server bills them."""
    return len(render_prompt(builtin_categories_block(), "", version).encode("utf-8"))


@dataclass(frozen=True, slots=True)
class GuardAnswer:
    """What a Llama Guard call returned, as stored: the answer's text and the log-probability
    of its first token (``safe`` or ``unsafe``), when the server gave it."""

    text: str
    logprob: float | None = None

    def to_raw(self) -> str:
        """Canonical JSON (what the output gate reads back)."""
        return json.dumps(
            {"logprob": self.logprob, "text": self.text}, sort_keys=True, separators=(",", ":")
        )


def _answer(raw: str) -> GuardAnswer:
    if len(raw) > _MAX_ANSWER_CHARS:
        raise OutputRejected(f"llama-guard answer: longer than {_MAX_ANSWER_CHARS} characters")
    try:
        data: Any = json.loads(raw)
    except (ValueError, RecursionError):
        raise OutputRejected("llama-guard answer: not JSON") from None
    text = data.get("text") if isinstance(data, dict) else None
    if not isinstance(text, str):
        raise OutputRejected("llama-guard answer: no text")
    return GuardAnswer(text, readable_logprob(data.get("logprob")))


def assessment(text: str) -> tuple[str, ...] | None:
    """The reference parser: None for ``safe``, else the listed codes; ``OutputRejected`` for
    an answer that is neither (it names no text the model wrote)."""
    text = text.strip()
    if text == "safe":
        return None
    found = _UNSAFE.fullmatch(text)
    if found is None:
        raise OutputRejected(
            "llama-guard answer: neither 'safe' nor 'unsafe' and one line of codes"
        )
    codes = tuple(code.strip() for code in found[1].split(","))
    for code in codes:
        if not _CODE.fullmatch(code):
            raise OutputRejected("llama-guard answer: a listed category is not a code S<n>")
    return codes


def guard_output(
    raw: str, sent_key: str, policy: Policy, contract: OutputContract
) -> tuple[ModerationOutput, float | None]:
    """The label, rules and confidence of one stored Llama Guard answer under ``policy``, and
    the chosen label's probability (None: the server gave no log-probability)."""
    answer = _answer(raw)
    codes = assessment(answer.text)
    p_first = math.exp(answer.logprob) if answer.logprob is not None else None
    rules = [rule.id for rule in policy.doc.rules]
    section = policy.guard_map
    if section is not None:
        known, mapped = GUARD_CODES, section.categories
    else:
        known = tuple(f"S{i}" for i in range(1, len(rules) + 1))
        mapped = dict(zip(known, rules, strict=True))
    label = policy.none_label
    rule_ids: tuple[str, ...] = ()
    p_label = p_first
    if codes is not None:
        unknown = [c for c in codes if c not in known]
        if unknown:
            raise OutputRejected(f"llama-guard answer: unknown category {unknown[0]}")
        named = [mapped[c] for c in codes if c in mapped]
        if named:
            label = contract.rule_label(named[0]) or policy.none_label
            wanted = {r for r in named if contract.rule_label(r) == label}
            rule_ids = tuple(r for r in rules if r in wanted)
        else:
            p_label = None  # unsafe in categories the policy does not read: no token says none
    why = contract.problem(label, rule_ids)
    if why is not None:  # the policy check refuses such a mapping; kept as a last guard
        raise OutputRejected(f"output contract: {why}")
    out = ModerationOutput(
        schema_version=1,
        correlation_id=sent_key,
        label=label,
        rule_ids=rule_ids,
        confidence=min(1.0, p_first) if p_first is not None else 1.0,
    )
    return out, p_label
