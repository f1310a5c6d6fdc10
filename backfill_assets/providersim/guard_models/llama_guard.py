"""Llama Guard 3 and 4 behind vLLM: the prompt, its categories and the assessment text (pure).

A post reaches the model in one of two shapes (``llama_guard_wire.py`` reads the bodies):

- ``POST /v1/chat/completions`` whose model name holds ``llama-guard`` (any case): the post is
  the last user message, judged under the model's built-in categories S1..S14
  (``LLAMA_GUARD_CATEGORIES``), as vLLM applies the model's own chat template;
- ``POST /v1/completions`` with a fully rendered prompt in Meta's format: the categories are
  the prompt's own (custom categories). Llama Guard 4 differs only in its special tokens
  (``<|header_start|>``, ``<|header_end|>``, ``<|eot|>`` for ``<|start_header_id|>``,
  ``<|end_header_id|>``, ``<|eot_id|>``), which parsing ignores::

    <|begin_of_text|><|start_header_id|>user<|end_header_id|>

    Task: Check if there is unsafe content in 'User' messages in conversations according our
    safety policy with the below categories.

    <BEGIN UNSAFE CONTENT CATEGORIES>
    S1: <name>.
    <description lines>
    S2: <name>.
    <END UNSAFE CONTENT CATEGORIES>

    <BEGIN CONVERSATION>

    User: <post>

    <END CONVERSATION>

    Provide your safety assessment for ONLY THE LAST User message ...<|eot_id|>...

Parsing takes the codes and names (lines ``S<n>: <name>`` between the category markers) and the
post (after ``User: `` up to the blank line before ``<END CONVERSATION>``); a prompt without
the markers, without a category or without ``User: `` is refused 400.

The answer is ``safe``, or ``unsafe`` and on a second line the violated codes, comma-separated
without spaces (``unsafe\\nS1,S10``). It is a function of the post's text alone:
``SimConfig.guard_answers`` pins the exact text per sha256 hex of the post; else, under the
built-in categories, every phrase of ``_BUILTIN_PHRASES`` found in the post (whole lower-cased
words, the longest phrase first, so ``kill myself`` is S11, not S1) adds its code; under custom
categories, the first category having a word of four letters or more of its name in the post
(whole words, case and a plural ``s`` ignored) is the one code. No phrase, no category: ``safe``.
A code the categories do not hold is never answered unless a fault or switch asks.

Switches (``SimConfig``, off by default; none applies to a pinned answer) copy real servers:
``guard_whitespace`` wraps the answer in blank lines and spaces (``\\n\\n unsafe\\nS1 \\n``),
``guard_case`` writes the assessment ``Safe``/``Unsafe`` or ``SAFE``/``UNSAFE`` (drawn per post),
``guard_third_line`` adds a third line to an unsafe answer (the categories' names),
``guard_unknown_code`` lists an unknown code after an unsafe answer's codes (``S1,S99``).

Content faults, each a billed 200 the client must refuse: ``malformed`` answers text that is
neither assessment (``MALFORMED_ANSWER``); ``unknown_label`` answers ``unsafe`` with one unknown
code (``S99``, or the next number the categories do not use); ``wrong_key`` (no key travels
with this dialect: an answer that is no answer to this request) sends no choice at all
(``choices: []``); ``bad_confidence`` gives the assessment's token a log-probability above 0 (a
probability of 1.7), so it shows only when logprobs were asked for.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from backfill_assets.providers.models.rules import count_tokens
from backfill_assets.providersim.config import FaultKind, SimConfig
from backfill_assets.providersim.faults import unit_draw
from backfill_assets.providersim.moderations import text_key
from backfill_assets.providersim.wire import ApiError

# Meta's MLCommons taxonomy: Llama Guard 3 and Llama Guard 4 share S1..S14.
LLAMA_GUARD_CATEGORIES: dict[str, str] = {
    "S1": "Violent Crimes",
    "S2": "Non-Violent Crimes",
    "S3": "Sex Crimes",
    "S4": "Child Sexual Exploitation",
    "S5": "Defamation",
    "S6": "Specialized Advice",
    "S7": "Privacy",
    "S8": "Intellectual Property",
    "S9": "Indiscriminate Weapons",
    "S10": "Hate",
    "S11": "Suicide & Self-Harm",
    "S12": "Sexual Content",
    "S13": "Elections",
    "S14": "Code Interpreter Abuse",
}
MALFORMED_ANSWER = "I'm sorry, I cannot assess whether this message is acceptable."
_GUARD_MARKER = "llama-guard"
_CATEGORIES_OPEN = "<BEGIN UNSAFE CONTENT CATEGORIES>"
_CATEGORIES_CLOSE = "<END UNSAFE CONTENT CATEGORIES>"
_CONVERSATION_OPEN = "<BEGIN CONVERSATION>"
_CONVERSATION_CLOSE = "<END CONVERSATION>"
_USER = "User: "
_CODE_LINE = re.compile(r"^(S\d+): (.*)$")
_WORD = re.compile(r"[a-z0-9']+")
# The assessment's probability: argmax at temperature 0, so at least a half.
_P_LOW, _P_SPAN = 0.55, 0.449

# Phrases (whole words, lower case) -> the built-in code they violate. S3-S6, S13 and S14
# have none: pin them.
_BUILTIN_TABLE: tuple[tuple[tuple[str, ...], str], ...] = (
    (("kill", "kills", "killed", "killing", "murder", "murdered", "stab", "shoot"), "S1"),
    (("scam", "scams", "scammer", "fraud", "steal", "stolen", "counterfeit"), "S2"),
    (("home address", "social security number"), "S7"),
    (("pirated", "torrent"), "S8"),
    (("make a bomb", "nerve agent", "bioweapon"), "S9"),
    (("hate", "hates", "hated", "hateful", "slur", "slurs"), "S10"),
    (("kill myself", "suicide", "self harm", "hurt myself"), "S11"),
    (("porn", "nude", "nudes"), "S12"),
)
_BUILTIN_PHRASES: dict[str, str] = {
    phrase: code for phrases, code in _BUILTIN_TABLE for phrase in phrases
}
_LONGEST_PHRASE = max(len(phrase.split()) for phrase in _BUILTIN_PHRASES)


@dataclass(frozen=True, slots=True)
class GuardPrompt:
    """What the model reads: its categories (code -> name, in order) and the post."""

    categories: Mapping[str, str]
    post: str
    # The model's own categories (chat route): judged by the phrase table.
    builtin: bool = False


def builtin_prompt(post: str) -> GuardPrompt:
    """What the chat route's template gives the model: the built-in categories and ``post``."""
    return GuardPrompt(LLAMA_GUARD_CATEGORIES, post, builtin=True)


@functools.cache
def template_tokens() -> int:
    """Tokens the model's chat template adds around the post on the chat route (the task, the
    built-in categories and the instructions), billed as prompt tokens as vLLM bills them."""
    categories = "\n".join(f"{code}: {name}." for code, name in LLAMA_GUARD_CATEGORIES.items())
    text = (
        "Task: Check if there is unsafe content in 'User' messages in conversations according "
        "our safety policy with the below categories.\n\n<BEGIN UNSAFE CONTENT CATEGORIES>\n"
        f"{categories}\n<END UNSAFE CONTENT CATEGORIES>\n\n<BEGIN CONVERSATION>\n\nUser: "
        "\n\n<END CONVERSATION>\n\nProvide your safety assessment for ONLY THE LAST User "
        "message in the above conversation:\n - First line must read 'safe' or 'unsafe'.\n - "
        "If unsafe, a second line must include a comma-separated list of violated categories."
    )
    return count_tokens(text)


def is_guard_model(model: str) -> bool:
    """Whether a chat request is for Llama Guard (its model name holds 'llama-guard')."""
    return _GUARD_MARKER in model.lower()


def _not_a_guard_prompt(what: str) -> ApiError:
    return ApiError(
        400,
        f"This simulator answers /v1/completions as Llama Guard: the prompt has no {what}.",
        param="prompt",
        code="invalid_value",
    )


def _between(text: str, start: int, close: str) -> tuple[str, int] | None:
    """The text from ``start`` to ``close`` and where ``close`` is (None: no ``close``)."""
    end = text.find(close, start)
    return None if end < 0 else (text[start:end], end)


def parse_guard_prompt(prompt: str) -> GuardPrompt:
    """The categories and post of a rendered Llama Guard prompt; ``ApiError`` (400) if it is
    none (see the module docstring)."""
    opened = prompt.find(_CATEGORIES_OPEN)
    found = None if opened < 0 else _between(prompt, opened, _CATEGORIES_CLOSE)
    if found is None:
        raise _not_a_guard_prompt(f"'{_CATEGORIES_OPEN}' ... '{_CATEGORIES_CLOSE}' block")
    block, block_end = found
    categories: dict[str, str] = {}
    for line in block.splitlines():
        match = _CODE_LINE.match(line)
        if match:
            categories[match[1]] = match[2].strip().removesuffix(".")
    if not categories:
        raise _not_a_guard_prompt("category line 'S<n>: <name>.'")
    start = prompt.find(_CONVERSATION_OPEN, block_end)
    end = prompt.rfind(_CONVERSATION_CLOSE)
    if start < 0 or end < start:
        raise _not_a_guard_prompt(f"'{_CONVERSATION_OPEN}' ... '{_CONVERSATION_CLOSE}' block")
    conversation = prompt[start + len(_CONVERSATION_OPEN) : end].lstrip("\n")
    if not conversation.startswith(_USER):
        raise _not_a_guard_prompt(f"'{_USER}' message")
    return GuardPrompt(categories, conversation[len(_USER) :].removesuffix("\n\n"))


def guard_text_in(prompt: object) -> str | None:
    """Best effort, for echoing errors: the post of a prompt, else the prompt itself."""
    if not isinstance(prompt, str):
        return None
    try:
        return parse_guard_prompt(prompt).post
    except ApiError:
        return prompt


def _code_number(code: str) -> int:
    return int(code[1:])


def builtin_codes(post: str) -> tuple[str, ...]:
    """Built-in codes the phrases of ``post`` violate, in code order."""
    words = _WORD.findall(post.lower())
    codes: set[str] = set()
    start = 0
    while start < len(words):
        for size in range(min(_LONGEST_PHRASE, len(words) - start), 0, -1):
            code = _BUILTIN_PHRASES.get(" ".join(words[start : start + size]))
            if code is not None:
                codes.add(code)
                start += size
                break
        else:
            start += 1
    return tuple(sorted(codes, key=_code_number))


def _stem(word: str) -> str:
    return word[:-1] if word.endswith("s") and len(word) > 4 else word


def custom_codes(post: str, categories: Mapping[str, str]) -> tuple[str, ...]:
    """The first custom category with a word (4+ letters) of its name in ``post``, if any."""
    words = {_stem(word) for word in _WORD.findall(post.lower())}
    for code, name in categories.items():
        if any(len(w) >= 4 and _stem(w) in words for w in _WORD.findall(name.lower())):
            return (code,)
    return ()


def unknown_code(categories: Mapping[str, str]) -> str:
    """A code the categories do not hold: S99, or the next number free after it."""
    number = 99
    while f"S{number}" in categories:
        number += 1
    return f"S{number}"


def assessment_probability(post: str) -> float:
    """The probability of the answer's assessment token, in [0.55, 0.999], from the post."""
    return _P_LOW + _P_SPAN * unit_draw("guard-assessment", post)


def bad_logprob() -> float:
    """What ``bad_confidence`` reports as the assessment's log-probability: ln 1.7, above 0."""
    return math.log(1.7)


def _with_switches(codes: tuple[str, ...], prompt: GuardPrompt, config: SimConfig) -> str:
    assessment, lines = ("unsafe", [",".join(codes)]) if codes else ("safe", [])
    if codes and config.guard_unknown_code:
        lines[0] += "," + unknown_code(prompt.categories)
    if codes and config.guard_third_line:
        lines.append(", ".join(prompt.categories[code] for code in codes))
    if config.guard_case:
        upper = unit_draw("guard-case", prompt.post) < 0.5
        assessment = assessment.upper() if upper else assessment.capitalize()
    text = "\n".join([assessment, *lines])
    return f"\n\n {text} \n" if config.guard_whitespace else text


def guard_answer_text(prompt: GuardPrompt, config: SimConfig, fault: FaultKind | None) -> str:
    """The answer to ``prompt``: pinned, or decided and dressed by the switches, then
    distorted by a ``malformed`` or ``unknown_label`` fault (module docstring)."""
    if fault == "malformed":
        return MALFORMED_ANSWER
    if fault == "unknown_label":
        return f"unsafe\n{unknown_code(prompt.categories)}"
    pinned = config.guard_answers.get(text_key(prompt.post))
    if pinned is not None:
        return pinned
    if prompt.builtin:
        codes = builtin_codes(prompt.post)
    else:
        codes = custom_codes(prompt.post, prompt.categories)
    return _with_switches(codes, prompt, config)
