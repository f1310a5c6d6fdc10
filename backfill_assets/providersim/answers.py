"""What the simulated model answers, and the error each fault produces (pure)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from backfill_assets.domain.policy.file import builtin_policy
from backfill_assets.domain.policy.output_gate import OutputContract, contract_from_schema
from backfill_assets.domain.policy.post_frame import decode_post
from backfill_assets.providers.models.rules import judge
from backfill_assets.providersim.config import FaultKind, SimConfig
from backfill_assets.providersim.corpus import accuracy_of, text_sha
from backfill_assets.providersim.faults import unit_draw
from backfill_assets.providersim.wire import ApiError

# Cloudflare answers a dead origin with an HTML page, not a JSON error; clients must cope.
BAD_GATEWAY_HTML = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>cloudflare</center>\r\n"
    b"</body>\r\n</html>\r\n"
)
FORCED_RETRY_AFTER_SECONDS = 1.0


def other_key(correlation_id: str) -> str:
    """A different, well-formed 64-hex key, for the ``wrong_key`` fault."""
    return hashlib.sha256(f"wrong:{correlation_id}".encode()).hexdigest()


def contract_of(schema: Any) -> OutputContract:
    """What the request's ``response_format`` schema allows: its labels and rule ids (and
    which rule leads to which label, from its descriptions); a foreign schema: its label enum,
    the first value meaning nothing applies; no schema: the built-in labels."""
    if schema is None:
        return OutputContract.of(builtin_policy())
    found = contract_from_schema(schema)
    if found is not None:
        return found
    # A schema that is not one of ours: answer within its label enum if it has one.
    try:
        labels = tuple(str(x) for x in schema["properties"]["label"]["enum"])
    except (KeyError, TypeError):
        labels = ()
    return OutputContract(labels, labels[0]) if labels else OutputContract(("unknown",), "unknown")


@dataclass(frozen=True, slots=True)
class CorpusAnswer:
    """What a model answers a corpus post: a label and its rules, the confidence it reports and
    the probability its label's tokens carry (``p_label``)."""

    label: str
    rules: tuple[str, ...]
    confidence: float
    p_label: float


# The label's probability, drawn within these: a right answer's by difficulty, a wrong one's
# (a share of wrong answers is sure of itself); a wrong answer to a harmful post is the none
# label this often.
_RIGHT_P = {"easy": (0.97, 0.999), "medium": (0.8, 0.985), "hard": (0.6, 0.9)}
_WRONG_P, _SURE_WRONG_P, _SURE_WRONG_SHARE = (0.55, 0.85), (0.85, 0.99), 0.15
_MISSED_AS_NONE = 0.7


def corpus_answer(config: SimConfig, model: str, post: str, schema: Any) -> CorpusAnswer | None:
    """``model``'s answer to a post of ``config.corpus`` (the framed, encoded post), right with
    the probability ``config.accuracy`` gives it, drawn from the seed, the model and the text;
    None: the post is not in the corpus, or its true label is not in the request's schema."""
    text = decode_post(post)
    truth = config.corpus.truth(text) if config.corpus is not None else None
    contract = contract_of(schema)
    if truth is None or truth.label not in contract.labels:
        return None
    key, none = text_sha(text), contract.none_label

    def draw(*what: str) -> float:
        return unit_draw(config.seed, "corpus", model, key, *what)

    label, others = truth.label, [lb for lb in contract.labels if lb != truth.label]
    right = not others or draw() < accuracy_of(config.accuracy, model, truth.difficulty)
    if not right:
        harmful = [lb for lb in others if lb != none]
        if not harmful or (label != none and none in others and draw("none") < _MISSED_AS_NONE):
            label = none
        else:
            near = truth.near if truth.near in harmful else None
            label = near or harmful[int(draw("near") * len(harmful))]
    kept = contract.rules_of(label) if label != none else ()
    rule = truth.rule if right and truth.rule in kept else None
    if kept and rule is None:
        rule = kept[int(draw("rule") * len(kept))]
    rules = (rule,) if rule is not None else ()
    low, high = _RIGHT_P[truth.difficulty] if right else _WRONG_P
    if not right and draw("sure") < _SURE_WRONG_SHARE:
        low, high = _SURE_WRONG_P
    p_label = low + draw("p") * (high - low)
    return CorpusAnswer(label, rules, round(p_label, 2), p_label)


def answer_content(
    fault: FaultKind | None,
    correlation_id: str,
    post: str,
    schema: Any = None,
    given: CorpusAnswer | None = None,
) -> tuple[str, str]:
    """Assistant content and finish reason, within the request's schema (``given``: a corpus
    post's answer); content faults distort an otherwise right answer."""
    if given is None:
        label, rules, confidence = judge(post, contract_of(schema))
    else:
        label, rules, confidence = given.label, given.rules, given.confidence
    answer: dict[str, object] = {
        "schema_version": 1,
        "correlation_id": other_key(correlation_id) if fault == "wrong_key" else correlation_id,
        "label": "maybe" if fault == "unknown_label" else label,
        "rule_ids": list(rules),
        "confidence": 1.7 if fault == "bad_confidence" else confidence,
    }
    content = json.dumps(answer)
    if fault == "malformed":
        # Output cut off at the token cap is how real models produce invalid JSON.
        return content[: len(content) // 2], "length"
    return content, "stop"


def fault_error(kind: FaultKind, model: str) -> ApiError:
    """The JSON error for a status-code fault (``502`` is answered as HTML elsewhere)."""
    if kind == "429":
        return ApiError(
            429,
            f"Rate limit reached for {model} on requests per min (RPM). Please try again in "
            "1s. (simulated)",
            error_type="requests",
            code="rate_limit_exceeded",
        )
    if kind == "400":
        return ApiError(400, "Invalid request (simulated fault).", code="invalid_value")
    if kind == "503":
        return ApiError(
            503,
            "The engine is currently overloaded, please try again later. (simulated)",
            error_type="server_error",
        )
    if kind == "500":
        return ApiError(
            500,
            "The server had an error while processing your request. Sorry about that! (simulated)",
            error_type="server_error",
        )
    raise ValueError(f"{kind!r} is not answered with a JSON error")


# A chat answer's tokens as the simulator counts them: words, runs of space, single marks.
_CHAT_TOKEN = re.compile(r"[A-Za-z0-9_]+|\s+|[^A-Za-z0-9_\s]")
_LABEL_VALUE = re.compile(r'"label"\s*:\s*"([^"]*)"')


def answer_logprobs(
    content: str, correlation_id: str, top_n: int, p_label: float | None = None
) -> dict[str, Any]:
    """``choices[0].logprobs`` of a chat-json answer: every token at p = 0.999 but those that
    spell the label's value, whose probability is ``p_label`` (a corpus answer's) or drawn from
    the key (0.55 to 0.999), spread over them, so a client reading it gets a known number."""
    found = _LABEL_VALUE.search(content)
    span = found.span(1) if found else (0, 0)
    tokens = [(m.group(0), m.start(), m.end()) for m in _CHAT_TOKEN.finditer(content)]
    spelled = [t for t in tokens if t[2] > span[0] and t[1] < span[1]]
    p_label = label_probability_of(correlation_id) if p_label is None else p_label
    each = math.log(p_label) / len(spelled) if spelled else 0.0
    entries = []
    for text, start, end in tokens:
        lp = each if end > span[0] and start < span[1] else math.log(0.999)
        entries.append(
            {
                "token": text,
                "logprob": lp,
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": [
                    {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}
                ][:top_n],
            }
        )
    return {"content": entries}


def label_probability_of(correlation_id: str) -> float:
    """The probability the simulator gives a key's label (0.55 to 0.999, from the key)."""
    draw = int(hashlib.sha256(f"p_label:{correlation_id}".encode()).hexdigest()[:8], 16)
    return 0.55 + (draw / 0xFFFFFFFF) * 0.449
