"""What the simulated model answers, and the error each fault produces (pure)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

from backfill_assets.domain.policy.file import builtin_policy
from backfill_assets.domain.policy.output_gate import OutputContract, contract_from_schema
from backfill_assets.providers.models.rules import judge
from backfill_assets.providersim.config import FaultKind
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


def answer_content(
    fault: FaultKind | None, correlation_id: str, post: str, schema: Any = None
) -> tuple[str, str]:
    """Assistant content and finish reason, within the request's schema; content faults
    distort an otherwise right answer."""
    label, rules, confidence = judge(post, contract_of(schema))
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


def answer_logprobs(content: str, correlation_id: str, top_n: int) -> dict[str, Any]:
    """``choices[0].logprobs`` of a chat-json answer: every token at p = 0.999 but those that
    spell the label's value, whose probability is drawn from the key (0.55 to 0.999, spread
    over them), so a client reading the label's probability gets a known number."""
    found = _LABEL_VALUE.search(content)
    span = found.span(1) if found else (0, 0)
    tokens = [(m.group(0), m.start(), m.end()) for m in _CHAT_TOKEN.finditer(content)]
    spelled = [t for t in tokens if t[2] > span[0] and t[1] < span[1]]
    p_label = label_probability_of(correlation_id)
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
