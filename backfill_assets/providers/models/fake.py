"""Deterministic in-process model: same input, same answer, same failures, every run."""

from __future__ import annotations

import asyncio
import hashlib
import math
from json.encoder import encode_basestring_ascii as _string

from backfill_assets.config.variables import DEFAULT_FAKE_MODEL
from backfill_assets.domain.policy.post_frame import decode_post, framed_post
from backfill_assets.providers.models.base import (
    ModelAdapter,
    ModelRequest,
    ModelResponse,
    RetriableError,
)
from backfill_assets.providers.models.rules import count_tokens, judge

USAGE_SHAPES = ("split", "total", "missing")


def _post_text(request: ModelRequest) -> str:
    """The post as its author wrote it (the frame's encoding undone), as a model reads it."""
    user = request.messages[-1]["content"]
    inner = framed_post(user)
    return user if inner is None else decode_post(inner)


# The answer as ``json.dumps(..., separators=(",", ":"))`` writes it, without building an
# encoder per call: the fake's own cost is not the pipeline's.
_ANSWER = '{"schema_version":1,"correlation_id":%s,"label":%s,"rule_ids":[%s],"confidence":%s}'


def _unit(*parts: str) -> float:
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class FakeModel(ModelAdapter):
    """Labels under the request's policy (``rules.judge``: a rule or label id found in the
    text, the keyword rules, else the label that means nothing applies) and answers raw JSON
    text for the pipeline to parse.

    Token usage is an estimate from text length (about four characters a token), reported as
    if the provider had billed it. ``failure_rate`` makes calls fail with a retriable error,
    decided by hash(key, attempt) so every run fails at the same places; ``malformed_rate``
    makes answers unparseable, decided by the key (every attempt the same).

    Hostile modes, as real providers behave: ``overbill_factor`` bills the prompt tokens times
    the factor (another tokenizer); ``usage_shape`` reports ``split`` (default), ``total``
    (the total alone) or ``missing`` (no usage at all).
    """

    name = "fake"

    def __init__(
        self,
        model: str = DEFAULT_FAKE_MODEL,
        latency_ms: float = 0.0,
        failure_rate: float = 0.0,
        malformed_rate: float = 0.0,
        seed: str = "fake",
        overbill_factor: float = 1.0,
        usage_shape: str = "split",
    ) -> None:
        super().__init__()
        self.model = model
        self.latency_s = latency_ms / 1000.0
        self.failure_rate = failure_rate
        self.malformed_rate = malformed_rate
        self.seed = seed
        self.overbill_factor = overbill_factor
        # What this fake "provider" billed in truth, whatever it reported (a meter for tests).
        self.billed_tokens = 0
        if usage_shape not in USAGE_SHAPES:
            raise ValueError(f"usage_shape must be one of {USAGE_SHAPES}")
        self.usage_shape = usage_shape

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer one request."""
        self.check_not_halted()
        self.stats.calls += 1
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if (
            self.failure_rate
            and _unit(self.seed, "fail", request.key, str(request.attempt)) < self.failure_rate
        ):
            self.stats.rate_limited += 1
            raise RetriableError("fake provider: 503 service unavailable", status=503)
        text = _post_text(request)
        label, rules, confidence = judge(text, request.contract)
        if self.malformed_rate and _unit(self.seed, "malformed", request.key) < self.malformed_rate:
            raw = '{"schema_version": 1, "label": "ok", "confidence": '
        else:
            raw = _ANSWER % (
                _string(request.key),
                _string(label),
                ",".join(_string(r) for r in rules),
                float.__repr__(confidence),
            )
        tokens_in = sum(count_tokens(m["content"]) + 4 for m in request.messages)
        tokens_in = math.ceil(tokens_in * self.overbill_factor)
        tokens_out = count_tokens(raw)
        self.billed_tokens += tokens_in + tokens_out
        if self.usage_shape == "total":
            tokens_in, tokens_out = tokens_in + tokens_out, 0
        elif self.usage_shape == "missing":
            # What a caller books for a call with no usage: the bound it reserved.
            bound = request.bound_tokens or request.estimated_tokens
            tokens_in, tokens_out = bound - request.max_output_tokens, request.max_output_tokens
        return ModelResponse(
            raw_text=raw,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            request_id=f"fake-{request.key[:12]}-{request.attempt}",
            usage_shape=self.usage_shape,
            latency_ms=self.latency_s * 1000.0,
        )
