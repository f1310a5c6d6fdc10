"""What each dialect answers an admitted request, and what the meter books for it.

By the time a request gets here ``app.py`` has checked its key, body, model and rate limits,
drawn its attempt's fault and waited out the latency; transport and status faults never get
here, content faults do. Each answer is a 200 and books exactly one ``BilledCall``:

- chat-json (any other chat model): ``answers.answer_content``, completion tokens counted by
  ``count_tokens``, and with ``logprobs: true`` its tokens' log-probabilities
  (``answers.answer_logprobs``: the label's value at a probability drawn from the key); a post
  of ``SimConfig.corpus`` is answered by its truth (``answers.corpus_answer``);
- Llama Guard on the chat route (built-in categories) and on ``/v1/completions`` (the prompt's
  categories): ``guard_models/llama_guard.py`` and ``llama_guard_wire.py``, completion
  tokens the answer's tokens;
- gpt-oss-safeguard: ``guard_models/safeguard.py``, completion tokens reasoning plus content;
- moderations: ``moderations.py``, free (0 tokens, cost 0).

Completions are priced with the simulator's own list (``SimConfig.prices``) and report
``usage`` in the shape ``usage_shape`` (or ``usage_shape_mix``) draws for their key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from backfill_assets.providers.models.rules import count_tokens
from backfill_assets.providersim.answers import answer_content, answer_logprobs, corpus_answer
from backfill_assets.providersim.billing.meter import (
    CHAT_ENDPOINT,
    COMPLETIONS_ENDPOINT,
    MODERATIONS_ENDPOINT,
    BilledCall,
    Meter,
)
from backfill_assets.providersim.billing.pricing import call_cost_nanos
from backfill_assets.providersim.billing.usage import cached_tokens, chat_usage_shape, usage_body
from backfill_assets.providersim.config import FaultKind, SimConfig
from backfill_assets.providersim.guard_models.llama_guard import (
    GuardPrompt,
    builtin_prompt,
    guard_answer_text,
)
from backfill_assets.providersim.guard_models.llama_guard_wire import (
    CompletionRequest,
    GuardToken,
    capped,
    guard_chat_body,
    guard_tokens,
    text_completion_body,
)
from backfill_assets.providersim.guard_models.safeguard import (
    safeguard_answer,
    safeguard_body,
    safeguard_usage,
)
from backfill_assets.providersim.http import Response
from backfill_assets.providersim.moderations import ModerationRequest, moderation_body
from backfill_assets.providersim.wire import ChatRequest, completion_body


@dataclass(frozen=True, slots=True)
class AdmittedChat:
    """A chat request that passed every check: its billed prompt tokens, key, post and fault."""

    chat: ChatRequest
    prompt: int
    correlation_id: str
    post: str
    fault: FaultKind | None


@dataclass(frozen=True, slots=True)
class AdmittedCompletion:
    """A legacy completion (a Llama Guard prompt) that passed every check."""

    request: CompletionRequest
    guard: GuardPrompt
    prompt: int
    correlation_id: str
    fault: FaultKind | None


@dataclass(frozen=True, slots=True)
class AdmittedModeration:
    """A moderation request that passed every check, with its fault (if any)."""

    request: ModerationRequest
    correlation_id: str
    fault: FaultKind | None


class Dialects:
    """Answers admitted requests in their dialect and books them on the meter."""

    def __init__(self, config: SimConfig, meter: Meter) -> None:
        self._config = config
        self._meter = meter

    def chat_json(self, call: AdmittedChat, request_id: str) -> Response:
        """The chat-json answer: the policy's JSON object within the request's schema."""
        chat, cid, schema = call.chat, call.correlation_id, call.chat.response_schema
        given = corpus_answer(self._config, chat.model, call.post, schema)
        content, finish_reason = answer_content(call.fault, cid, call.post, schema, given)
        completion = count_tokens(content)
        usage = self._bill(request_id, cid, chat, call.prompt, completion)
        p_label = given.p_label if given is not None else None
        top = chat.top_logprobs
        logprobs = answer_logprobs(content, cid, top, p_label) if chat.logprobs else None
        body = completion_body(
            chat.model, content, finish_reason, usage, chat.service_tier, logprobs
        )
        return Response.json(200, body)

    def guard_chat(self, call: AdmittedChat, request_id: str) -> Response:
        """Llama Guard on the chat route: the built-in categories, logprobs if asked for."""
        chat = call.chat
        prompt = builtin_prompt(call.post)
        tokens, finish_reason = self._guard_tokens(prompt, call.fault, chat.max_tokens)
        usage = self._bill(request_id, call.correlation_id, chat, call.prompt, len(tokens))
        top = chat.top_logprobs if chat.logprobs else None
        no_choice = call.fault == "wrong_key"
        body = guard_chat_body(chat.model, tokens, finish_reason, usage, top, no_choice=no_choice)
        return Response.json(200, body)

    def guard_completion(self, call: AdmittedCompletion, request_id: str) -> Response:
        """Llama Guard on the legacy completions route: the prompt's own categories."""
        request = call.request
        tokens, finish_reason = self._guard_tokens(call.guard, call.fault, request.max_tokens)
        usage = self._bill_completion(
            request_id, call.correlation_id, request.model, call.prompt, len(tokens)
        )
        body = text_completion_body(
            request.model,
            tokens,
            finish_reason,
            usage,
            request.logprobs,
            no_choice=call.fault == "wrong_key",
        )
        return Response.json(200, body)

    def safeguard(self, call: AdmittedChat, request_id: str) -> Response:
        """gpt-oss-safeguard: the chat-json answer behind its analysis, capped at max tokens."""
        chat, cid = call.chat, call.correlation_id
        answer = safeguard_answer(chat, cid, call.post, call.fault, self._config)
        cached = self._book(
            request_id, cid, chat.model, call.prompt, answer.completion_tokens, chat.service_tier
        )
        shape = chat_usage_shape(self._config, cid)
        usage = safeguard_usage(shape, call.prompt, answer, cached, self._config)
        field = self._config.safeguard_reasoning_field
        body = safeguard_body(chat.model, answer, usage, chat.service_tier, field)
        return Response.json(200, body)

    def moderation(self, call: AdmittedModeration, request_id: str) -> Response:
        """The moderation answer, billed at zero."""
        body = moderation_body(call.request, self._config, call.fault)
        # Free, but billed as a call all the same: ledgers count calls as well as cost.
        self._meter.bill(
            BilledCall(
                request_id,
                call.correlation_id,
                call.request.model,
                0,
                0,
                billed_at=time.time(),
                endpoint=MODERATIONS_ENDPOINT,
            )
        )
        return Response(200, body, {"content-type": "application/json"})

    def _guard_tokens(
        self, prompt: GuardPrompt, fault: FaultKind | None, max_tokens: int | None
    ) -> tuple[tuple[GuardToken, ...], str]:
        text = guard_answer_text(prompt, self._config, fault)
        return capped(guard_tokens(text, prompt.post, fault), max_tokens)

    def _bill(
        self, request_id: str, correlation_id: str, chat: ChatRequest, prompt: int, completion: int
    ) -> dict[str, Any] | None:
        """Book a chat completion; the ``usage`` its answer reports."""
        tier = chat.service_tier
        cached = self._book(request_id, correlation_id, chat.model, prompt, completion, tier)
        shape = chat_usage_shape(self._config, correlation_id)
        return usage_body(shape, prompt, completion, cached)

    def _bill_completion(
        self, request_id: str, correlation_id: str, model: str, prompt: int, completion: int
    ) -> dict[str, Any] | None:
        """Book a legacy completion; the ``usage`` its answer reports."""
        cached = self._book(
            request_id, correlation_id, model, prompt, completion, endpoint=COMPLETIONS_ENDPOINT
        )
        shape = chat_usage_shape(self._config, correlation_id)
        return usage_body(shape, prompt, completion, cached)

    def _book(
        self,
        request_id: str,
        correlation_id: str,
        model: str,
        prompt: int,
        completion: int,
        tier: str = "default",
        endpoint: str = CHAT_ENDPOINT,
    ) -> int:
        """One billed call at the simulator's prices; its cached prompt tokens."""
        cached = cached_tokens(prompt, self._config.cached_prefix_tokens)
        cost = call_cost_nanos(self._config.prices, model, prompt, cached, completion, tier)
        call = BilledCall(
            request_id,
            correlation_id,
            model,
            prompt,
            completion,
            "",
            cached,
            tier,
            cost,
            time.time(),
            endpoint,
        )
        self._meter.bill(call)
        return cached
