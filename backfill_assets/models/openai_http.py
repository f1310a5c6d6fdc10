"""OpenAI-compatible chat completions over ``httpx.AsyncClient`` (OpenAI, vLLM, Ollama, LiteLLM).

One post of one tenant per request; the model's answer is returned raw for the pipeline to
validate. Failures are classified for the dispatcher's state machine:

- 429, 408, 409, 5xx, timeouts, connection errors, a 2xx that is no completion: ``RetriableError``
  (with the provider's Retry-After, if any);
- any other 4xx (and 3xx: a wrong base URL): ``TransportRejected``, never retried.

Exception messages are stored in the ledger and dead letters, so they carry only the status,
the provider's error type/code and a scrubbed excerpt: never post text, never the API key.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx

from ..prices import PriceTable
from ..ratelimit import EndpointLimiter, Permit
from ._openai_wire import (
    NotACompletion,
    advertised_limits,
    error_summary,
    parse_completion,
    request_body,
    retry_after_seconds,
)
from .base import ModelAdapter, ModelRequest, ModelResponse, RetriableError, TransportRejected

_RETRIABLE_4XX = frozenset({408, 409})
_USER_AGENT = "backfill-moderation/0.1 (+httpx)"


@dataclass(frozen=True, slots=True)
class HttpTimeouts:
    """Seconds: to connect, between bytes read, to write, and for the whole call."""

    connect: float = 5.0
    read: float = 60.0
    write: float = 10.0
    total: float = 120.0

    def for_httpx(self) -> httpx.Timeout:
        """Per-phase timeouts; the total is enforced around the call."""
        # Waiting for a pooled connection is bounded by the total as well.
        return httpx.Timeout(
            connect=self.connect, read=self.read, write=self.write, pool=self.total
        )


def _post_text(request: ModelRequest) -> list[str]:
    """Texts a provider might echo back: the user message and the post inside it."""
    user = request.messages[-1]["content"] if request.messages else ""
    start, end = user.find("<post>\n"), user.rfind("\n</post>")
    inner = user[start + len("<post>\n") : end] if 0 <= start < end else ""
    return [t for t in (user, inner) if t]


class OpenAIHttpModel(ModelAdapter):
    """Chat completions against ``{base_url}/chat/completions``, admitted by a shared limiter."""

    name = "openai_http"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        limiter: EndpointLimiter,
        api_key: str = "",
        prices: PriceTable | None = None,
        timeouts: HttpTimeouts | None = None,
        max_tokens_param: str = "max_tokens",
        max_connections: int = 256,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.limiter = limiter
        self._api_key = api_key
        self._prices = prices or PriceTable.from_json("")
        self._timeouts = timeouts or HttpTimeouts()
        self._max_tokens_param = max_tokens_param
        headers = {"user-agent": _USER_AGENT}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=self._timeouts.for_httpx(),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            transport=transport,
            follow_redirects=False,
        )

    def cost_of(self, model: str, tokens_in: int, tokens_out: int) -> float:
        """Cost from the configured price table."""
        return self._prices.cost(model, tokens_in, tokens_out)

    async def aclose(self) -> None:
        """Close pooled connections."""
        await self._client.aclose()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send one request once the limiter admits it; classify what comes back."""
        body = request_body(request, self._max_tokens_param)
        permit = await self.limiter.acquire(request.estimated_tokens)
        self.stats.calls += 1
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._timeouts.total):
                response = await self._client.post("/chat/completions", json=body)
                raw = await response.aread()
        except (TimeoutError, httpx.TimeoutException) as exc:
            self.limiter.on_failure(permit, time.perf_counter() - started)
            raise RetriableError(f"timeout ({type(exc).__name__})") from None
        except httpx.RequestError as exc:
            self.limiter.on_failure(permit)
            raise RetriableError(f"connection error ({type(exc).__name__})") from None
        latency = time.perf_counter() - started
        if 200 <= response.status_code < 300:
            return self._answered(request, permit, response, raw, latency)
        raise self._refused(request, permit, response, raw)

    def _answered(
        self,
        request: ModelRequest,
        permit: Permit,
        response: httpx.Response,
        raw: bytes,
        latency: float,
    ) -> ModelResponse:
        request_id = response.headers.get("x-request-id", "")
        advertised = advertised_limits(response.headers)
        try:
            completion = parse_completion(raw)
        except NotACompletion as exc:
            self.limiter.on_failure(permit)
            raise RetriableError(
                f"HTTP {response.status_code}: {exc}",
                status=response.status_code,
                request_id=request_id or None,
            ) from None
        usage = completion.usage
        if usage is not None:
            tokens_in, tokens_out = usage.prompt_tokens, usage.completion_tokens
            # Providers count the prompt plus the requested completion cap against TPM.
            charged = tokens_in + request.max_output_tokens
        else:
            # Unreported usage (some local servers): book the reservation's estimate, flagged.
            tokens_in = request.estimated_tokens - request.max_output_tokens
            tokens_out = request.max_output_tokens
            charged = request.estimated_tokens
        self.limiter.on_success(permit, latency, charged, advertised)
        self.stats.latencies_ms.append(latency * 1000.0)
        return ModelResponse(
            raw_text=completion.content,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            request_id=request_id or completion.id or "",
            usage_reported=usage is not None,
            latency_ms=latency * 1000.0,
            cost=self._prices.cost(request.model, tokens_in, tokens_out),
        )

    def _refused(
        self, request: ModelRequest, permit: Permit, response: httpx.Response, raw: bytes
    ) -> RetriableError | TransportRejected:
        status = response.status_code
        request_id = response.headers.get("x-request-id") or None
        summary, message = error_summary(
            status,
            raw,
            response.headers.get("content-type", ""),
            echoes=_post_text(request),
            secrets=[self._api_key] if self._api_key else [],
        )
        retry_after = retry_after_seconds(response.headers, message)
        if status == 429:
            self.stats.rate_limited += 1
            self.limiter.on_rate_limited(permit, retry_after, advertised_limits(response.headers))
            return RetriableError(
                summary, status=status, retry_after=retry_after, request_id=request_id
            )
        self.limiter.on_failure(permit)
        if status in _RETRIABLE_4XX or status >= 500:
            return RetriableError(
                summary, status=status, retry_after=retry_after, request_id=request_id
            )
        if status in (401, 403):
            summary += " (check BACKFILL_MODEL_API_KEY and BACKFILL_MODEL_BASE_URL)"
        return TransportRejected(summary, status=status, request_id=request_id)
