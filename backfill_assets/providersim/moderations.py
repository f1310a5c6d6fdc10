"""OpenAI's moderation endpoint, ``POST /v1/moderations``: request, scores and answer (pure).

Request body (``model`` is optional and defaults to ``omni-moderation-latest``)::

    {"model": "omni-moderation-latest", "input": "text"}
    {"model": ..., "input": ["text", "text", ...]}
    {"model": ..., "input": [{"type": "text", "text": "..."}, ...]}

Image parts (``{"type": "image_url", ...}``) are refused 400: the simulator judges text only.
The answer holds one result per input, in input order, and no ``usage`` (the endpoint is
free)::

    {"id": "modr-<32 hex>", "model": <model>, "results": [
        {"flagged": bool,
         "categories": {<13 categories>: bool},
         "category_scores": {<13 categories>: float in [0, 1]},
         "category_applied_input_types": {<13 categories>: ["text"]}}]}

Every category applies to text, so each lists ``["text"]``; OpenAI answers ``[]`` for input
types a category does not cover (images, for most of them), which never reach a score here.

Scores are a deterministic function of the text: the highest weight among the phrases of
``_PHRASES`` found in it (whole lower-cased words), plus a jitter below 0.01 drawn from a hash of
the category and the text, so the same text always scores the same and text matching nothing
scores below 0.05 in every category. A text of ``SimConfig.corpus`` is scored by its truth
instead (``corpus_scores``). ``SimConfig.moderation_scores`` pins scores per text (keyed by the
sha256 hex of the text's UTF-8), over both. ``sexual/minors`` has no phrase: pin it.

The correlation id of a request (for ``fault_by_key``, fault draws and the meter) is the sha256
hex of its first input's text: the product sends no key on this endpoint. Its rate-limit charge
is one request and ``sum(count_tokens(text))`` tokens over the inputs, as chat counts tokens.

Faults distort an otherwise right answer, each a 200 the client must refuse:
``malformed`` cuts the JSON body in half; ``wrong_key`` drops the last result (one result fewer
than inputs); ``unknown_label`` names each result's scores ``scores`` instead of
``category_scores``; ``bad_confidence`` reports the first result's ``violence`` score as 1.7.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backfill_assets.providers.models.rules import count_tokens
from backfill_assets.providersim.config import MODERATION_CATEGORIES, FaultKind, SimConfig
from backfill_assets.providersim.corpus import accuracy_of, text_sha
from backfill_assets.providersim.faults import unit_draw
from backfill_assets.providersim.wire import ApiError

DEFAULT_MODERATION_MODEL = "omni-moderation-latest"
# OpenAI's own thresholds are per category and its own business; one cut keeps tests readable.
FLAG_THRESHOLD = 0.5
# Scores of text that matches no phrase stay below this (see _score).
_JITTER = 0.01
_FLOOR = 0.00001
_BAD_SCORE = 1.7
_WORD = re.compile(r"[a-z0-9']+")

# Phrases (whole words, lower case) -> the scores they imply. Spam ("buy now", "click here")
# is deliberately absent: it is no category of this endpoint.
_TABLE: tuple[tuple[tuple[str, ...], dict[str, float]], ...] = (
    (("kill", "kills", "killed", "killing"), {"violence": 0.91}),
    (("hurt", "hurts", "hurting"), {"violence": 0.74}),
    (("attack", "attacked", "attacking"), {"violence": 0.66}),
    (("kill you",), {"violence": 0.93, "harassment/threatening": 0.88, "harassment": 0.71}),
    (("beat you up",), {"violence": 0.84, "harassment/threatening": 0.76}),
    (("gore", "gory", "dismembered"), {"violence/graphic": 0.81}),
    (("idiot", "idiots", "moron", "morons"), {"harassment": 0.83}),
    (("stupid", "loser", "losers"), {"harassment": 0.71}),
    (("hate", "hates", "hated", "hateful"), {"hate": 0.72}),
    (("exterminate them",), {"hate/threatening": 0.82, "hate": 0.77, "violence": 0.74}),
    (("cocaine", "heroin", "counterfeit"), {"illicit": 0.78}),
    (("buy drugs",), {"illicit": 0.81}),
    (("make a bomb",), {"illicit/violent": 0.89, "illicit": 0.84, "violence": 0.62}),
    (("kill myself",), {"self-harm": 0.92, "self-harm/intent": 0.9}),
    (("hurt myself",), {"self-harm": 0.81, "self-harm/intent": 0.73}),
    (("want to die",), {"self-harm": 0.7, "self-harm/intent": 0.76}),
    (("how to self harm",), {"self-harm/instructions": 0.79, "self-harm": 0.8}),
    (("porn", "nude", "nudes"), {"sexual": 0.84}),
)
_PHRASES: dict[str, dict[str, float]] = {
    phrase: scores for phrases, scores in _TABLE for phrase in phrases
}
_LONGEST_PHRASE = max(len(phrase.split()) for phrase in _PHRASES)


@dataclass(frozen=True, slots=True)
class ModerationRequest:
    """The parts of a moderation request the simulator acts on."""

    model: str
    texts: tuple[str, ...]


def _invalid(message: str, param: str | None, code: str | None = "invalid_type") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _part_text(part: dict[str, Any], index: int) -> str:
    kind = part.get("type")
    if kind == "image_url":
        raise _invalid(
            f"Image inputs are not supported by this simulator: 'input[{index}]' has type "
            "'image_url'. Send text only.",
            f"input[{index}]",
            "invalid_value",
        )
    if kind != "text":
        raise _invalid(
            f"Invalid value for 'input[{index}].type': {kind!r}. Expected 'text' or 'image_url'.",
            f"input[{index}].type",
            "invalid_value",
        )
    text = part.get("text")
    if not isinstance(text, str):
        raise _invalid(
            f"Invalid type for 'input[{index}].text': expected a string.", f"input[{index}].text"
        )
    return text


def _texts(raw: Any) -> tuple[str, ...]:
    if raw is None:
        missing = "missing_required_parameter"
        raise _invalid("Missing required parameter: 'input'.", "input", missing)
    if isinstance(raw, str):
        return (raw,)
    if not isinstance(raw, list):
        raise _invalid(
            "Invalid type for 'input': expected a string, an array of strings or an array of "
            "objects.",
            "input",
        )
    if not raw:
        raise _invalid(
            "Invalid 'input': empty array. Expected an array with minimum length 1.",
            "input",
            "empty_array",
        )
    # One kind per array, as the API's schema allows: all strings or all content parts.
    if all(isinstance(item, str) for item in raw):
        return tuple(raw)
    out: list[str] = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            raise _invalid(
                f"Invalid type for 'input[{index}]': expected an object like the others.",
                f"input[{index}]",
            )
        out.append(_part_text(item, index))
    return tuple(out)


def _json_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise ApiError(
            400,
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly.)",
        ) from None


def parse_moderation_request(raw: bytes) -> ModerationRequest:
    """Validate a request body as the API does; raises ``ApiError`` (400) if invalid."""
    body = _json_body(raw)
    if not isinstance(body, dict):
        raise _invalid("Invalid request body: expected a JSON object.", None)
    model = body.get("model", DEFAULT_MODERATION_MODEL)
    if not isinstance(model, str) or not model:
        raise _invalid("Invalid 'model': expected a non-empty string.", "model")
    return ModerationRequest(model, _texts(body.get("input")))


def moderation_text_in(body: Any) -> str | None:
    """Best effort, for echoing errors: the first input text of a body, even an invalid one."""
    if isinstance(body, bytes):
        try:
            body = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            return None
    raw = body.get("input") if isinstance(body, dict) else None
    first = raw[0] if isinstance(raw, list) and raw else raw
    if isinstance(first, dict):
        first = first.get("text")
    return first if isinstance(first, str) else None


def text_key(text: str) -> str:
    """sha256 hex of ``text``: its correlation id and its key in ``moderation_scores``."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def correlation_id_of(request: ModerationRequest) -> str:
    """The key of the request's first input (see the module docstring)."""
    return text_key(request.texts[0])


def input_tokens(request: ModerationRequest) -> int:
    """Tokens the request charges against TPM: ``count_tokens`` of every input."""
    return sum(count_tokens(text) for text in request.texts)


def _phrase_scores(text: str) -> dict[str, float]:
    words = _WORD.findall(text.lower())
    found: dict[str, float] = {}
    for start in range(len(words)):
        for size in range(1, _LONGEST_PHRASE + 1):
            for category, weight in _PHRASES.get(" ".join(words[start : start + size]), {}).items():
                found[category] = max(found.get(category, 0.0), weight)
    return found


# A corpus post's category score, drawn within these: a harmful post's when the endpoint is
# right (by difficulty) and when it is wrong; a harmless medium or hard post's when it is right
# (by difficulty) and when it is wrong (a false alarm at any threshold up to 0.5).
_SHOWN = {"easy": (0.85, 0.99), "medium": (0.7, 0.9), "hard": (0.6, 0.8)}
_MISSED = (0.02, 0.3)
_LOOKS_LIKE = {"medium": (0.01, 0.15), "hard": (0.05, 0.3)}
_FALSE_ALARM = (0.5, 0.6)


def corpus_scores(config: SimConfig, model: str, text: str) -> dict[str, float] | None:
    """The 13 scores of a text of ``config.corpus`` (None: not in it): every category near 0
    (below 0.01) but the one the post shows as, scored by whether ``model`` is right on it
    (``config.accuracy``, drawn from the seed, the model and the text). A harmless easy post
    keeps every category below 0.01; a post whose label has no category too."""
    corpus = config.corpus
    truth = corpus.truth(text) if corpus is not None else None
    if corpus is None or truth is None:
        return None
    key = text_sha(text)

    def draw(*what: str) -> float:
        return unit_draw(config.seed, "corpus", model, key, *what)

    scores = {c: round(_FLOOR + draw(c) * (_JITTER - 0.001), 6) for c in MODERATION_CATEGORIES}
    harmful = truth.label != corpus.none_label
    if truth.category is None or (not harmful and truth.difficulty == "easy"):
        return scores
    right = draw() < accuracy_of(config.accuracy, model, truth.difficulty)
    if harmful:
        low, high = _SHOWN[truth.difficulty] if right else _MISSED
    else:
        low, high = _LOOKS_LIKE[truth.difficulty] if right else _FALSE_ALARM
    scores[truth.category] = round(low + draw("score") * (high - low), 6)
    return scores


def category_scores(
    text: str, pins: Mapping[str, Mapping[str, float]], truth: dict[str, float] | None = None
) -> dict[str, float]:
    """The 13 scores of ``text``: phrase weights plus jitter (or ``truth``, a corpus post's
    scores), then any pinned scores."""
    hits = _phrase_scores(text) if truth is None else {}
    scores: dict[str, float] = {}
    for category in MODERATION_CATEGORIES:
        jitter = unit_draw("moderation", category, text) * _JITTER
        # A hit lands within half the jitter of its weight; a miss stays just above zero.
        base = hits[category] - _JITTER / 2 if category in hits else _FLOOR
        scores[category] = round(min(1.0, base + jitter), 6)
    scores.update(truth or {})
    scores.update(pins.get(text_key(text), {}))
    return scores


def moderation_result(
    text: str, pins: Mapping[str, Mapping[str, float]], truth: dict[str, float] | None = None
) -> dict[str, Any]:
    """One entry of ``results`` for ``text`` (``truth``: a corpus post's scores)."""
    scores = category_scores(text, pins, truth)
    categories = {category: score >= FLAG_THRESHOLD for category, score in scores.items()}
    return {
        "flagged": any(categories.values()),
        "categories": categories,
        "category_scores": scores,
        "category_applied_input_types": {category: ["text"] for category in scores},
    }


def moderation_answer(
    request: ModerationRequest, config: SimConfig, fault: FaultKind | None = None
) -> dict[str, Any]:
    """The answer to ``request`` as JSON data, distorted by a ``wrong_key``, ``unknown_label``
    or ``bad_confidence`` fault (``malformed`` is applied to the encoded body)."""
    pins, model = config.moderation_scores, request.model
    results = [
        moderation_result(text, pins, corpus_scores(config, model, text)) for text in request.texts
    ]
    if fault == "wrong_key":
        results = results[:-1]
    elif fault == "unknown_label":
        for result in results:
            result["scores"] = result.pop("category_scores")
    elif fault == "bad_confidence":
        results[0]["category_scores"]["violence"] = _BAD_SCORE
    return {"id": f"modr-{secrets.token_hex(16)}", "model": request.model, "results": results}


def cut_off(encoded: str) -> str:
    """The first half of an encoded body, as a dropped proxy connection leaves it: not JSON."""
    return encoded[: len(encoded) // 2]


def moderation_body(
    request: ModerationRequest, config: SimConfig, fault: FaultKind | None = None
) -> bytes:
    """The 200 body for ``request``, distorted as the content ``fault`` says (module docstring)."""
    encoded = json.dumps(moderation_answer(request, config, fault))
    return (cut_off(encoded) if fault == "malformed" else encoded).encode("utf-8")
