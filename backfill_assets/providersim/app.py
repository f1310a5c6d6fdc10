"""Routes of the simulated provider: chat completions, legacy completions, moderations, model
list and admin.

Order of checks for ``POST /v1/chat/completions``, ``POST /v1/completions`` and
``POST /v1/moderations``: API key (401), ``forbid`` (403), body (400), ``strict_models`` (404),
rate limits (429, consuming nothing), then the fault plan for the admitted attempt, then latency
and the answer. Forced ``429``/``401``/``403``/``404`` faults consume no capacity either; every
other admitted attempt does, and its attempt number (per correlation id, counted from 1) feeds
the fault draw. With ``echo_errors`` every JSON error but 401/403 quotes the request's user
message (moderations: its first input; completions: the prompt's post). The routes share the
rate-limit buckets; see ``moderations.py`` for what a moderation request charges, its
correlation id and its content faults.

A chat request speaks a dialect by its model's name: one holding ``llama-guard`` is Llama Guard
(``guard_models/llama_guard.py``: the post is the last user message, its correlation id the
post's sha256 hex), one holding ``safeguard`` is gpt-oss-safeguard
(``guard_models/safeguard.py``), any other the chat-json dialect. ``POST /v1/completions``
takes Llama Guard prompts only (custom categories). A completion's charge is its prompt plus
max tokens; what each dialect answers and bills is ``dialects.py``'s.
The Files and Batch APIs (``batch_api.py``) register their routes on the same router.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from backfill_assets.providers.models.rules import count_tokens
from backfill_assets.providersim.access import Access
from backfill_assets.providersim.answers import (
    BAD_GATEWAY_HTML,
    FORCED_RETRY_AFTER_SECONDS,
    fault_error,
)
from backfill_assets.providersim.batch.api import BatchApi
from backfill_assets.providersim.billing.meter import (
    CHAT_ENDPOINT,
    COMPLETIONS_ENDPOINT,
    MODERATIONS_ENDPOINT,
    Meter,
    MeterSnapshot,
)
from backfill_assets.providersim.billing.org_usage import costs_page, usage_page
from backfill_assets.providersim.billing.usage import billed_prompt
from backfill_assets.providersim.config import FaultKind, RetryAfterFormat, SimConfig
from backfill_assets.providersim.dialects import (
    AdmittedChat,
    AdmittedCompletion,
    AdmittedModeration,
    Dialects,
)
from backfill_assets.providersim.faults import decide_fault, unit_draw
from backfill_assets.providersim.guard_models.llama_guard import (
    is_guard_model,
    parse_guard_prompt,
    template_tokens,
)
from backfill_assets.providersim.guard_models.llama_guard_wire import (
    completion_text_in,
    parse_completion_request,
)
from backfill_assets.providersim.guard_models.safeguard import is_safeguard_model
from backfill_assets.providersim.http import Drop, Reply, Request, Response, Router
from backfill_assets.providersim.limits import (
    Denial,
    RateLimiter,
    exhausted_headers,
    retry_after_headers,
)
from backfill_assets.providersim.moderations import correlation_id_of as moderation_key
from backfill_assets.providersim.moderations import (
    input_tokens,
    moderation_text_in,
    parse_moderation_request,
    text_key,
)
from backfill_assets.providersim.wire import (
    ApiError,
    correlation_id_of,
    last_user_text,
    new_request_id,
    parse_chat_request,
    post_text_of,
    prompt_tokens,
    user_text_in,
)

_STATUS_FAULTS: frozenset[FaultKind] = frozenset({"500", "503", "400"})
_REFUSAL_FAULTS: frozenset[FaultKind] = frozenset({"401", "403", "404"})
_CHAT = f"POST {CHAT_ENDPOINT}"
_MODERATIONS = f"POST {MODERATIONS_ENDPOINT}"
_COMPLETIONS = f"POST {COMPLETIONS_ENDPOINT}"
# What reset_headers_on_5xx claims: every limit used up for six minutes (limits 0 = unset).
_EXHAUSTED_RESET_SECONDS = 360.0
_UNSET_LIMITS = {"requests": 500, "tokens": 200_000}
# What admission hands back: the answer to await, given the request id.
_Answer = Callable[[str], Awaitable[Reply]]


class SimApp:
    """The simulated provider's behaviour; runs on one event loop."""

    def __init__(self, config: SimConfig, meter: Meter) -> None:
        self.config = config
        self.meter = meter
        self.limiter = RateLimiter(config.rpm, config.tpm, config.burst_seconds)
        self._rng = random.Random(config.seed)
        self.router = Router()
        self.router.add("POST", "/v1/chat/completions", self.chat_completions)
        self.router.add("POST", "/v1/completions", self.completions)
        self.router.add("POST", "/v1/moderations", self.moderations)
        self.router.add("GET", "/v1/models", self.list_models)
        self.router.add("GET", "/v1/organization/usage/completions", self.org_usage)
        self.router.add("GET", "/v1/organization/costs", self.org_costs)
        self.router.add("GET", "/_sim/meter", self.read_meter)
        self.router.add("POST", "/_sim/reset", self.reset_meter)
        self.access = Access(config, meter)
        self.dialects = Dialects(config, meter)
        self.batch_api = BatchApi(config, meter, self.access)
        self.batch_api.register(self.router)

    def reset(self) -> None:
        """Clear the meter (and with it attempt numbers) and refill the rate-limit buckets."""
        self.meter.clear()
        self.limiter.reset()
        self.batch_api.reset()

    def _latency_seconds(self) -> float:
        median = self.config.latency_median_ms
        if median <= 0:
            return 0.0
        sigma = self.config.latency_sigma
        ms = self._rng.lognormvariate(math.log(median), sigma) if sigma > 0 else median
        return ms / 1000.0

    async def chat_completions(self, request: Request) -> Reply:
        """``POST /v1/chat/completions``."""
        return await self._serve(request, CHAT_ENDPOINT, self._admit_chat, user_text_in)

    async def completions(self, request: Request) -> Reply:
        """``POST /v1/completions`` (Llama Guard prompts)."""
        return await self._serve(
            request, COMPLETIONS_ENDPOINT, self._admit_completion, completion_text_in
        )

    async def moderations(self, request: Request) -> Reply:
        """``POST /v1/moderations``."""
        return await self._serve(
            request, MODERATIONS_ENDPOINT, self._admit_moderation, moderation_text_in
        )

    async def _serve(
        self,
        request: Request,
        endpoint: str,
        admit: Callable[[Request], _Answer],
        echo_text: Callable[[bytes], str | None],
    ) -> Reply:
        """What both answering routes share: meter, error bodies, request id, headers."""
        self.meter.record_request(endpoint)
        request_id = new_request_id()
        started = time.monotonic()
        rate_headers: dict[str, str] | None = None
        try:
            answer = admit(request)
            # Stamped at admission, before latency, as a provider reports its buckets.
            rate_headers = self.limiter.headers()
            reply = await answer(request_id)
        except ApiError as exc:
            error = self._echoing(exc, request, echo_text)
            reply = Response.json(error.status, error.body(), error.headers)
        if isinstance(reply, Drop):
            return reply
        self.meter.record_status(reply.status)
        if reply.status >= 500 and self.config.reset_headers_on_5xx:
            # Added first, so they win over the live bucket headers below.
            reply = reply.with_headers(self._exhausted_headers())
        elapsed_ms = round((time.monotonic() - started) * 1000)
        return reply.with_headers(
            {
                "x-request-id": request_id,
                "openai-processing-ms": str(elapsed_ms),
                **(rate_headers if rate_headers is not None else self.limiter.headers()),
            }
        )

    def _echoing(
        self, error: ApiError, request: Request, echo_text: Callable[[bytes], str | None]
    ) -> ApiError:
        if not self.config.echo_errors or error.status in (401, 403):
            return error
        text = echo_text(request.body)
        return error if text is None else error.quoting(text)

    def _exhausted_headers(self) -> dict[str, str]:
        limits = {"requests": self.config.rpm, "tokens": self.config.tpm}
        claimed = {kind: limit or _UNSET_LIMITS[kind] for kind, limit in limits.items()}
        return exhausted_headers(claimed, _EXHAUSTED_RESET_SECONDS)

    def _admit_chat(self, request: Request) -> _Answer:
        """Auth, validation, rate limits and the fault draw; no await, so atomic on the loop."""
        self.access.check(request, _CHAT)
        chat = parse_chat_request(request.body)
        self.access.check_model(chat.model, _CHAT)
        prompt = billed_prompt(prompt_tokens(chat), self.config.prompt_token_factor)
        charge = prompt + (chat.max_tokens or self.config.default_max_tokens)
        user_text = last_user_text(chat)
        dialect: Callable[[AdmittedChat, str], Response]
        if is_guard_model(chat.model):
            # Llama Guard reads the message as it is; no key travels, so the text's hash is one.
            # Its chat template wraps the post in the task and categories: billed as prompt.
            prompt += template_tokens()
            charge += template_tokens()
            correlation_id, post = text_key(user_text), user_text
            dialect = self.dialects.guard_chat
        else:
            correlation_id, post = correlation_id_of(user_text), post_text_of(user_text)
            safeguard = is_safeguard_model(chat.model)
            dialect = self.dialects.safeguard if safeguard else self.dialects.chat_json
        flex = chat.service_tier == "flex"
        fault = self._gate(request, _CHAT, chat.model, charge, correlation_id, flex=flex)
        call = AdmittedChat(chat, prompt, correlation_id, post, fault)
        return partial(self._respond, fault, chat.model, partial(dialect, call))

    def _admit_completion(self, request: Request) -> _Answer:
        """As ``_admit_chat`` for a Llama Guard prompt: the key is its post's sha256 hex."""
        self.access.check(request, _COMPLETIONS)
        completion = parse_completion_request(request.body)
        guard = parse_guard_prompt(completion.prompt)
        model = completion.model
        self.access.check_model(model, _COMPLETIONS)
        factor = self.config.prompt_token_factor
        prompt = billed_prompt(count_tokens(completion.prompt), factor)
        charge = prompt + (completion.max_tokens or self.config.default_max_tokens)
        correlation_id = text_key(guard.post)
        fault = self._gate(request, _COMPLETIONS, model, charge, correlation_id)
        call = AdmittedCompletion(completion, guard, prompt, correlation_id, fault)
        return partial(self._respond, fault, model, partial(self.dialects.guard_completion, call))

    def _admit_moderation(self, request: Request) -> _Answer:
        """As ``_admit_chat``: the charge is the inputs' tokens, the key the first input's."""
        self.access.check(request, _MODERATIONS)
        moderation = parse_moderation_request(request.body)
        self.access.check_model(moderation.model, _MODERATIONS)
        correlation_id = moderation_key(moderation)
        charge = input_tokens(moderation)
        fault = self._gate(request, _MODERATIONS, moderation.model, charge, correlation_id)
        call = AdmittedModeration(moderation, correlation_id, fault)
        answer = partial(self.dialects.moderation, call)
        return partial(self._respond, fault, moderation.model, answer)

    def _gate(
        self,
        request: Request,
        endpoint: str,
        model: str,
        charge: int,
        correlation_id: str,
        *,
        flex: bool = False,
    ) -> FaultKind | None:
        """Rate limits, then the attempt's fault draw; consumes capacity unless refused."""
        fmt = self.config.retry_after_format
        denial = self.limiter.check(charge)
        if denial is not None:
            raise _rate_limited(denial, model, fmt)
        attempt = self.meter.record_attempt(correlation_id)
        if flex and self._flex_unavailable(correlation_id, attempt):
            raise _resource_unavailable(model)
        fault = decide_fault(self.config, correlation_id, attempt)
        if fault == "429":
            error = fault_error("429", model)
            error.headers.update(retry_after_headers(FORCED_RETRY_AFTER_SECONDS, fmt))
            raise error
        if fault in _REFUSAL_FAULTS:
            raise self.access.fault(fault, request, model, endpoint)
        self.limiter.consume(charge)
        self.meter.record_accepted()
        return fault

    async def _misbehave(self, fault: FaultKind | None, model: str) -> Reply | None:
        """Latency, then what a transport or status fault answers (None: answer normally)."""
        if fault == "timeout":
            await asyncio.sleep(self.config.hang_seconds)
            self.meter.record_drop("timeout")
            return Drop(reset=False)
        await asyncio.sleep(self._latency_seconds())
        if fault == "reset":
            self.meter.record_drop("reset")
            return Drop(reset=True)
        if fault == "502":
            return Response(502, BAD_GATEWAY_HTML, {"content-type": "text/html"})
        if fault in _STATUS_FAULTS:
            raise fault_error(fault, model)
        return None

    async def _respond(
        self,
        fault: FaultKind | None,
        model: str,
        answer: Callable[[str], Response],
        request_id: str,
    ) -> Reply:
        """Latency, then the fault's misbehaviour or the dialect's billed answer."""
        early = await self._misbehave(fault, model)
        return early if early is not None else answer(request_id)

    def _flex_unavailable(self, correlation_id: str, attempt: int) -> bool:
        share = self.config.flex_unavailable_share
        return share > 0 and unit_draw(self.config.seed, "flex", correlation_id, attempt) < share

    async def list_models(self, request: Request) -> Reply:
        """``GET /v1/models``."""
        try:
            self.access.check(request, "GET /v1/models")
        except ApiError as exc:
            return Response.json(exc.status, exc.body())
        data = [
            {"id": model, "object": "model", "created": 0, "owned_by": "providersim"}
            for model in self.config.models
        ]
        return Response.json(200, {"object": "list", "data": data})

    async def org_usage(self, request: Request) -> Reply:
        """``GET /v1/organization/usage/completions``: this simulator's billed calls."""
        return self._org(request, usage_page)

    async def org_costs(self, request: Request) -> Reply:
        """``GET /v1/organization/costs``: what its own prices charged, per day."""
        return self._org(request, costs_page)

    def _org(self, request: Request, page: Callable[[MeterSnapshot, str], Any]) -> Reply:
        try:
            self.access.check(request, f"GET {request.path}")
            self.batch_api.batches.advance()
            return Response.json(200, page(self.meter.snapshot(), request.query))
        except ApiError as exc:
            return Response.json(exc.status, exc.body())

    async def read_meter(self, request: Request) -> Reply:
        """``GET /_sim/meter``: the meter snapshot as JSON (batches due to finish are billed)."""
        self.batch_api.batches.advance()
        return Response.json(200, self.meter.snapshot().to_dict())

    async def reset_meter(self, request: Request) -> Reply:
        """``POST /_sim/reset``: clear the meter and refill the buckets."""
        self.reset()
        return Response.json(200, {"reset": True})


def _resource_unavailable(model: str) -> ApiError:
    """Flex has no capacity: OpenAI answers 429 and bills nothing."""
    return ApiError(
        429,
        f"Resource unavailable: the flex tier has no capacity for {model} right now. Please "
        "try again later, or send the request without service_tier flex.",
        error_type="rate_limit_error",
        code="resource_unavailable",
    )


def _rate_limited(denial: Denial, model: str, fmt: RetryAfterFormat) -> ApiError:
    unit = "RPM" if denial.kind == "requests" else "TPM"
    wait_ms = max(1, math.ceil(denial.wait_seconds * 1000))
    return ApiError(
        429,
        f"Rate limit reached for {model} on {denial.kind} per min ({unit}): Limit "
        f"{denial.limit}, Requested {denial.requested}. Please try again in {wait_ms}ms.",
        error_type=denial.kind,
        code="rate_limit_exceeded",
        headers=retry_after_headers(denial.wait_seconds, fmt),
    )
