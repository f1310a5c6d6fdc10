"""OpenAI's moderation endpoint (``POST {base_url}/moderations``): the ``openai-moderation``
dialect.

The request is ``{"model": ..., "input": [<the post's text>]}``: one post of one tenant, as
every other call, and the text alone (no key travels with it, so the answer is bound to the
request that asked it). A 2xx must be a moderation response: an object whose ``results`` array
holds exactly one object per input; anything else is a ``RetriableError`` like a chat 2xx that
is no completion. The one result is returned raw, as canonical JSON, for the output gate to map
onto the policy (``domain/policy/moderation_map.py``); a result with its scores in the wrong
field or out of range is refused there, a ``schema_rejected`` dead letter.

The endpoint is free and reports no usage: a call books zero tokens (``usage_shape`` ``none``)
at the model's list price per token, zero for the moderation models in the built-in table. The
limiter, the error taxonomy, the bounded body and the key's redaction are the chat adapter's.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from backfill_assets.domain.money.prices import Tier
from backfill_assets.providers.models.base import ModelRequest, ModelResponse, RetriableError
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.providers.models.openai_wire import advertised_limits, loads_or_none
from backfill_assets.providers.provider_text import safe_id
from backfill_assets.providers.ratelimit import Permit

# What the ledger says of a call whose endpoint bills no tokens (never "missing": nothing
# was left unreported, and no bound is booked in its place).
NO_USAGE = "none"


def moderation_body(request: ModelRequest) -> dict[str, Any]:
    """The one post's text as the endpoint's ``input`` array (the user message the dialect
    built: the text alone, unframed)."""
    return {"model": request.model, "input": [request.messages[-1]["content"]]}


def one_result(body: bytes) -> dict[str, Any]:
    """The single result of a moderation response; ``ValueError`` saying why it is not one."""
    data = loads_or_none(body)
    if not isinstance(data, dict):
        raise ValueError("2xx body is not a JSON object")
    results = data.get("results")
    if not isinstance(results, list):
        raise ValueError("2xx body has no results array")
    if len(results) != 1 or not isinstance(results[0], dict):
        raise ValueError(f"{len(results)} results for 1 input")
    result: dict[str, Any] = results[0]
    return result


class OpenAIModerationModel(OpenAIHttpModel):
    """``POST {base_url}/moderations``, admitted by the same shared limiter as chat calls."""

    name = "openai_moderation"
    path = "/moderations"

    def body(self, request: ModelRequest, tier: Tier) -> dict[str, Any]:
        """The moderation request (the endpoint has no tiers: standard only)."""
        return moderation_body(request)

    def _answered(
        self,
        request: ModelRequest,
        permit: Permit,
        response: httpx.Response,
        raw: bytes,
        latency: float,
    ) -> ModelResponse:
        secrets = [self._api_key] if self._api_key else []
        request_id = safe_id(response.headers.get("x-request-id"), secrets) or ""
        try:
            result = one_result(raw)
        except ValueError as exc:
            self.limiter.on_failure(permit)
            raise RetriableError(
                f"HTTP {response.status_code}: {exc}",
                status=response.status_code,
                request_id=request_id or None,
            ) from None
        self.limiter.on_success(
            permit, latency, request.estimated_tokens, advertised_limits(response.headers)
        )
        self.stats.latencies_ms.append(latency * 1000.0)
        booked = self._prices.booked(request.model, Tier.STANDARD)
        return ModelResponse(
            raw_text=json.dumps(result, sort_keys=True, separators=(",", ":")),
            tokens_in=0,
            tokens_out=0,
            request_id=request_id,
            usage_shape=NO_USAGE,
            latency_ms=latency * 1000.0,
            cost_nanos=self._prices.cost(request.model, 0, 0) if booked is not None else 0,
            service_tier=Tier.STANDARD.value,
            price_booked="" if booked is None else booked.to_json(),
            cost_unknown=booked is None,
        )
