"""OpenAI-compatible chat completions over ``httpx.AsyncClient`` (OpenAI, vLLM, Ollama, LiteLLM).

One post of one tenant per request; the model's answer is returned raw for the pipeline to
validate. Failures are classified for the dispatcher's state machine:

- 429, 408, 409, 5xx, timeouts, connection errors, a 2xx that is no completion: ``RetriableError``
  (with the provider's Retry-After, if any);
- the flex tier's "resource unavailable" (a 429 that says so, or 498): ``CapacityUnavailable``,
  retried without a rate cut; after ``BACKFILL_FLEX_FALLBACK_AFTER_SECONDS`` of it,
  ``BACKFILL_FLEX_FALLBACK=standard`` sends the rest of the run at the standard tier;
- 401, 403, 404, 3xx and account-level codes (``errors.RUN_FATAL_CODES``): ``RunFatalError``,
  the run stops and every key stays pending;
- any other 4xx: ``TransportRejected``, never retried.
The scopes come from one table, ``models.errors``, shared with batch mode.

Exception messages are stored in the ledger and dead letters, so they carry only the status,
the provider's error type/code and a scrubbed excerpt: never post text, never the API key.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Any

import httpx

from backfill_assets import __version__
from backfill_assets.config.variables import HttpSettings, ModelSettings
from backfill_assets.domain.money.flex_quota import FlexQuota
from backfill_assets.domain.money.prices import PriceTable, Tier, event_cost
from backfill_assets.domain.policy.post_frame import decode_post, framed_post
from backfill_assets.providers.bounded_body import (
    ACCEPT_ENCODING,
    CHAT_MAX_BYTES,
    BadBody,
    read_capped,
    read_head,
)
from backfill_assets.providers.models.base import (
    CapacityUnavailable,
    ModelAdapter,
    ModelRequest,
    ModelResponse,
    RetriableError,
    RunFatalError,
    TransportRejected,
)
from backfill_assets.providers.models.errors import Scope, classify, run_fatal_hint
from backfill_assets.providers.models.openai_wire import (
    Envelope,
    NotACompletion,
    advertised_limits,
    error_code,
    error_summary,
    loads_or_none,
    parse_completion,
    request_body,
    retry_after_seconds,
)
from backfill_assets.providers.models.timeouts import FLEX_MIN_TIMEOUT_S, HttpTimeouts
from backfill_assets.providers.provider_text import safe_id
from backfill_assets.providers.ratelimit import EndpointLimiter, Permit

_USER_AGENT = f"backfill-moderation/{__version__} (+httpx)"
_log = logging.getLogger(__name__)


def _post_text(request: ModelRequest) -> list[str]:
    """Texts a provider might echo back: the user message and the post inside it."""
    user = request.messages[-1]["content"] if request.messages else ""
    inner = framed_post(user) or ""
    # As sent (encoded) and as written: a provider may echo either.
    return [t for t in dict.fromkeys((user, inner, decode_post(inner))) if t]


class OpenAIHttpModel(ModelAdapter):
    """Chat completions against ``{base_url}/chat/completions``, admitted by a shared limiter."""

    name = "openai_http"
    # Where a request goes, under the base URL (the moderation dialect's adapter: /moderations).
    path = "/chat/completions"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        limiter: EndpointLimiter,
        api_key: str = "",
        settings: ModelSettings | None = None,
        http: HttpSettings | None = None,
        prices: PriceTable | None = None,
        tier: Tier | None = None,
        timeouts: HttpTimeouts | None = None,
        max_connections: int = 256,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """``settings`` and ``http`` are the groups the settings parsed (their defaults when
        None); ``prices``, ``tier`` and ``timeouts`` replace what they would give."""
        super().__init__()
        m = settings if settings is not None else ModelSettings()
        h = http if http is not None else HttpSettings()
        tier = Tier(m.service_tier) if tier is None else tier
        if tier is Tier.BATCH:
            raise ValueError("the batch tier is BACKFILL_DISPATCH=batch, not a chat request")
        self.model = model
        self.limiter = limiter
        self.tier = tier
        self._flex_fallback = m.flex_fallback
        self._fallback_after_s = m.flex_fallback_after_s
        # Start of the current stretch of "no capacity" answers (None: the last call answered).
        self._unavailable_since: float | None = None
        # A deadline plan's last moment for flex (epoch seconds): from then on every request
        # goes at standard, refused or not, so a flex that answers slowly cannot eat the time
        # the rest needs at standard (runner/deadline_run.py). None: no such moment.
        self.standard_from: float | None = None
        # A deadline plan's flex keys per tenant: a key beyond its tenant's share goes at
        # standard, as the plan priced it. None: every key at this adapter's tier.
        self.flex_quota: FlexQuota | None = None
        self._api_key = api_key
        self._prices = m.prices() if prices is None else prices
        timeouts = timeouts or HttpTimeouts.of(h)
        if tier is Tier.FLEX:
            timeouts = HttpTimeouts(
                connect=timeouts.connect,
                read=max(timeouts.read, FLEX_MIN_TIMEOUT_S),
                write=timeouts.write,
                total=max(timeouts.total, FLEX_MIN_TIMEOUT_S),
            )
        self._timeouts = timeouts
        self._max_tokens_param = m.max_tokens_param
        self._logprobs = m.logprobs
        self._share_limit = h.share_limit
        headers = {"user-agent": _USER_AGENT, "accept-encoding": ACCEPT_ENCODING}
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

    def echoes(self, request: ModelRequest) -> list[str]:
        """Texts of the request a provider might echo back, scrubbed from every message."""
        return _post_text(request)

    def body(self, request: ModelRequest, tier: Tier) -> dict[str, Any]:
        """The request's JSON body for ``path`` (the chat completion: the policy's schema)."""
        return request_body(request, self._max_tokens_param, tier, self._logprobs)

    def path_for(self, request: ModelRequest) -> str:
        """Where the request goes, under the base URL."""
        return self.path

    def envelope(self, raw: bytes, request: ModelRequest) -> Envelope:
        """The 2xx's answer, id and usage (``NotACompletion``: it is no answer at all)."""
        completion = parse_completion(raw)
        return Envelope(
            completion.content,
            completion.id,
            completion.billed,
            completion.served_tier,
            logprobs=completion.logprobs,
        )

    def cost_of(self, model: str, tokens_in: int, tokens_out: int) -> int:
        """Cost from the configured price table."""
        return self._prices.cost(model, tokens_in, tokens_out)

    def cost_bound(self, model: str, prompt_tokens: int, output_tokens: int) -> int | None:
        """At the tier sent, and at the standard tier too: a flex request may fall back to it,
        and an answer that does not say it was served at flex is booked at it."""
        tiers = {self.tier, Tier.STANDARD}
        return self._prices.cost_bound(model, sorted(tiers), prompt_tokens, output_tokens)

    def rate_limit(self) -> tuple[str, EndpointLimiter] | None:
        """One account = base URL + model + key; the key only as a short hash."""
        if not self._share_limit:
            return None
        digest = hashlib.sha256(self._api_key.encode("utf-8")).hexdigest()[:12]
        return f"{self._client.base_url}#{self.model}#{digest}", self.limiter

    async def aclose(self) -> None:
        """Close pooled connections."""
        await self._client.aclose()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send one request once the limiter admits it; classify what comes back."""
        if (
            self.tier is Tier.FLEX
            and self.standard_from is not None
            and time.time() >= self.standard_from
        ):
            self.tier = Tier.STANDARD
            _log.warning("the deadline plan's time for flex is over: the rest goes at standard")
        tier = self.tier
        quota = self.flex_quota
        if (
            tier is Tier.FLEX
            and quota is not None
            and not quota.takes_flex(request.tenant_id, request.key)
        ):
            tier = Tier.STANDARD
        body = self.body(request, tier)
        self.check_not_halted()
        permit = await self.limiter.acquire(request.estimated_tokens, request.tenant_id)
        try:
            # The run may have been stopped while this call waited for its slot.
            self.check_not_halted()
        except BaseException:
            self.limiter.on_unused(permit)
            raise
        self.stats.calls += 1
        started = time.perf_counter()
        try:
            async with (
                asyncio.timeout(self._timeouts.total),
                self._client.stream("POST", self.path_for(request), json=body) as response,
            ):
                if 200 <= response.status_code < 300:
                    raw = await read_capped(response, CHAT_MAX_BYTES)
                else:
                    # An error body's start says all we keep of it; the status decides.
                    raw = await read_head(response, CHAT_MAX_BYTES)
        except BadBody as exc:
            # Billed or not, nothing in it can be read: this key's transport failed.
            self.limiter.on_failure(permit)
            raise TransportRejected(
                f"HTTP {response.status_code}: {exc}", status=response.status_code
            ) from None
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
        secrets = [self._api_key] if self._api_key else []
        request_id = safe_id(response.headers.get("x-request-id"), secrets) or ""
        advertised = advertised_limits(response.headers)
        try:
            completion = self.envelope(raw, request)
        except NotACompletion as exc:
            self.limiter.on_failure(permit)
            raise RetriableError(
                f"HTTP {response.status_code}: {exc}",
                status=response.status_code,
                request_id=request_id or None,
            ) from None
        billed = completion.billed
        cached = written = reasoning = 0
        if billed is not None:
            tokens_in, tokens_out, shape = billed.tokens_in, billed.tokens_out, billed.shape
            cached, written, reasoning = billed.cached, billed.cache_written, billed.reasoning
            # Providers count the prompt plus the requested completion cap against TPM.
            charged = max(billed.total, tokens_in + request.max_output_tokens)
        else:
            # No usage at all: book the most the call could have cost (never 0), flagged.
            bound = request.bound_tokens or request.estimated_tokens
            tokens_in, tokens_out, shape = (
                bound - request.max_output_tokens,
                request.max_output_tokens,
                "missing",
            )
            charged = request.estimated_tokens
        self.limiter.on_success(permit, latency, charged, advertised)
        self.stats.latencies_ms.append(latency * 1000.0)
        self._unavailable_since = None
        tier = completion.served_tier
        booked = self._prices.booked(request.model, tier)
        return ModelResponse(
            raw_text=completion.content,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            request_id=request_id or safe_id(completion.id, secrets) or "",
            usage_shape=shape,
            latency_ms=latency * 1000.0,
            cost_nanos=self._cost(request, tokens_in, tokens_out, shape, cached, written, tier),
            tokens_cached=cached,
            tokens_cache_written=written,
            tokens_reasoning=reasoning,
            answer_from=completion.answer_from,
            logprobs=completion.logprobs,
            service_tier=tier.value,
            price_booked="" if booked is None else booked.to_json(),
            cost_unknown=booked is None,
        )

    def _cost(
        self,
        request: ModelRequest,
        tokens_in: int,
        tokens_out: int,
        shape: str,
        cached: int = 0,
        written: int = 0,
        tier: Tier = Tier.STANDARD,
    ) -> int:
        # A total-only usage is priced as the dearest split the call allows (the completion
        # used its cap), so an invoice never under-recovers what the provider charged.
        tokens = (tokens_in, cached, written, tokens_out)
        cap = request.max_output_tokens
        return event_cost(self._prices, request.model, tier, shape, tokens, cap)

    def _refused(
        self, request: ModelRequest, permit: Permit, response: httpx.Response, raw: bytes
    ) -> RetriableError | TransportRejected | RunFatalError:
        status = response.status_code
        secrets = [self._api_key] if self._api_key else []
        request_id = safe_id(response.headers.get("x-request-id"), secrets)
        summary, message = error_summary(
            status,
            raw,
            response.headers.get("content-type", ""),
            echoes=self.echoes(request),
            secrets=secrets,
        )
        scope = classify(status, error_code(loads_or_none(raw)), message)
        retry_after = retry_after_seconds(response.headers, message, resets=status == 429)
        if scope is Scope.CAPACITY:
            self.limiter.on_capacity_unavailable(permit)
            self.stats.capacity_unavailable += 1
            self._note_unavailable()
            return CapacityUnavailable(
                summary, status=status, retry_after=retry_after, request_id=request_id
            )
        if scope is Scope.RUN:
            self.limiter.on_failure(permit)
            endpoint = str(self._client.base_url).rstrip("/") + self.path_for(request)
            return RunFatalError(
                f"{summary} from {endpoint} ({run_fatal_hint(status)})",
                status=status,
                endpoint=endpoint,
                request_id=request_id,
            )
        if status == 429:
            self.stats.rate_limited += 1
            self.limiter.on_rate_limited(permit, retry_after, advertised_limits(response.headers))
            return RetriableError(
                summary, status=status, retry_after=retry_after, request_id=request_id
            )
        self.limiter.on_failure(permit)
        if scope is Scope.RETRY:
            return RetriableError(
                summary, status=status, retry_after=retry_after, request_id=request_id
            )
        return TransportRejected(summary, status=status, request_id=request_id)

    def _note_unavailable(self) -> None:
        """Count a stretch of flex unavailability; past the limit, fall back if allowed."""
        now = time.monotonic()
        if self._unavailable_since is None:
            self._unavailable_since = now
        stretch = now - self._unavailable_since
        if (
            self.tier is Tier.FLEX
            and self._flex_fallback == "standard"
            and stretch >= self._fallback_after_s
        ):
            self.tier = Tier.STANDARD
            _log.warning(
                "flex tier unavailable for %.0fs: the rest of this run is sent at the standard "
                "tier (BACKFILL_FLEX_FALLBACK=standard)",
                stretch,
            )
