"""OpenAI's moderation endpoint (``POST {base_url}/moderations``): the ``openai-moderation``
dialect.

The request is ``{"model": ..., "input": [<text>, ...]}``: posts of one tenant only, each its
text alone (no key travels with it: each answer is bound to its place in the request that
asked it). A 2xx must be a moderation response: an object whose ``results`` array holds
exactly one object per input; anything else is a ``RetriableError`` like a chat 2xx that is no
completion. Each post's result is returned raw, as canonical JSON, for the output gate to map
onto the policy (``domain/policy/dialects/moderation_map.py``); a result with its scores in
the wrong field or out of range is refused there, a ``schema_rejected`` dead letter.

The endpoint is free and reports no usage: a call books zero tokens (``usage_shape`` ``none``)
at the model's list price per token, zero for the moderation models in the built-in table. The
limiter, the error taxonomy, the bounded body and the key's redaction are the chat adapter's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import httpx

from backfill_assets.config.variables import ModelSettings
from backfill_assets.domain.money.prices import Tier
from backfill_assets.providers.models.base import ModelRequest, ModelResponse, RetriableError
from backfill_assets.providers.models.moderation_wire import NO_USAGE, moderation_body, results_of
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.providers.models.openai_wire import advertised_limits
from backfill_assets.providers.provider_text import safe_id
from backfill_assets.providers.ratelimit import Permit

# How long the first post of a request waits for others of its tenant to join it: a moment,
# so a lone post is not held back (the dispatcher's workers ask at the same time or not at all).
JOIN_SECONDS = 0.005


class OpenAIModerationModel(OpenAIHttpModel):
    """``POST {base_url}/moderations``, admitted by the same shared limiter as chat calls.

    Posts of one tenant asked for together (within ``JOIN_SECONDS``) go in one request of at
    most ``BACKFILL_MODERATION_INPUTS_PER_REQUEST`` inputs; each comes back as its own
    response, the request's id shared, so the dispatcher books and validates every key as
    before. One request takes one slot of the limiter; a failed request fails each of its
    posts alike (each retried on its own).
    """

    name = "openai_moderation"
    path = "/moderations"

    def __init__(self, *, inputs_per_request: int | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        settings: ModelSettings = kw.get("settings") or ModelSettings()
        self.inputs_per_request = max(
            1, inputs_per_request or settings.moderation_inputs_per_request
        )
        # Per tenant: the posts waiting for their request, and the requests being sent.
        self._open: dict[str, list[tuple[ModelRequest, asyncio.Future[ModelResponse]]]] = {}
        self._sending: set[asyncio.Task[None]] = set()

    def body(self, request: ModelRequest, tier: Tier) -> dict[str, Any]:
        """The moderation request (the endpoint has no tiers: standard only)."""
        return moderation_body(request)

    def echoes(self, request: ModelRequest) -> list[str]:
        """Every post of the request: a provider may echo any of them in an error."""
        return [m["content"] for m in request.messages if m.get("content")]

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One post's result, sent alone or joined with others of its tenant."""
        if self.inputs_per_request == 1:
            [one] = _split(await super().complete(request))
            return one
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[ModelResponse] = loop.create_future()
        group = self._open.setdefault(request.tenant_id, [])
        group.append((request, answer))
        if len(group) >= self.inputs_per_request:
            self._send(request.tenant_id, group)
        elif len(group) == 1:
            loop.call_later(JOIN_SECONDS, self._send, request.tenant_id, group)
        return await answer

    def _send(self, tenant_id: str, group: list[tuple[ModelRequest, Any]]) -> None:
        if self._open.get(tenant_id) is not group:
            return  # already sent (it filled up before its moment)
        del self._open[tenant_id]
        task = asyncio.ensure_future(self._request(group))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _request(self, group: list[tuple[ModelRequest, Any]]) -> None:
        lead = group[0][0]
        joined = dataclasses.replace(
            lead,
            messages=[r.messages[-1] for r, _a in group],
            estimated_tokens=sum(r.estimated_tokens for r, _a in group),
            bound_tokens=sum(r.bound_tokens for r, _a in group),
        )
        try:
            response = await super().complete(joined)
        except BaseException as exc:  # each post fails alike; a cancel reaches them too
            for _r, answer in group:
                if not answer.done():
                    answer.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_r, answer), one in zip(group, _split(response), strict=True):
            if not answer.done():
                answer.set_result(one)

    async def aclose(self) -> None:
        """Requests still being sent are cancelled (their posts fail, retried next run)."""
        for task in list(self._sending):
            task.cancel()
        await super().aclose()

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
            results = results_of(raw, len(request.messages))
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
            raw_text=json.dumps(results),
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


def _split(response: ModelResponse) -> list[ModelResponse]:
    """A request's response as one per post: each its result alone, canonical JSON (the
    results are read once, whatever the request's size)."""
    return [
        dataclasses.replace(
            response, raw_text=json.dumps(result, sort_keys=True, separators=(",", ":"))
        )
        for result in json.loads(response.raw_text)
    ]
