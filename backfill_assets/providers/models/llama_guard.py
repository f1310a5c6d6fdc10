"""Llama Guard 3/4 behind vLLM: the ``llama-guard`` dialect's adapter.

A post goes alone to the model's chat template (``{base}/chat/completions``) or inside the
policy's own prompt (``{base}/completions``, the request's one message of role
``PROMPT_ROLE``), asking for the first tokens' log-probabilities (``guard_wire.py``). What comes
back is stored as the answer's text and the assessment's log-probability, read onto the policy by
the output gate (``domain/policy/dialects/llama_guard.py``). Usage, the limiter, the error taxonomy,
the bounded body and the key's redaction are the chat adapter's.
"""

from __future__ import annotations

from typing import Any

from backfill_assets.domain.money.prices import Tier
from backfill_assets.domain.policy.rubric import PROMPT_ROLE
from backfill_assets.providers.models.base import ModelRequest
from backfill_assets.providers.models.guard_wire import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    guard_answer,
    guard_body,
    post_in_prompt,
)
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.providers.models.openai_wire import Envelope


def _raw_prompt(request: ModelRequest) -> bool:
    return bool(request.messages) and request.messages[0]["role"] == PROMPT_ROLE


class LlamaGuardModel(OpenAIHttpModel):
    """Llama Guard through vLLM's OpenAI-compatible server (standard tier only)."""

    name = "llama_guard"

    def path_for(self, request: ModelRequest) -> str:
        """``/completions`` for a raw prompt, else ``/chat/completions``."""
        return COMPLETIONS_PATH if _raw_prompt(request) else CHAT_PATH

    def body(self, request: ModelRequest, tier: Tier) -> dict[str, Any]:
        """The guard's request (``guard_wire.guard_body``)."""
        return guard_body(request, self._max_tokens_param, _raw_prompt(request))

    def envelope(self, raw: bytes, request: ModelRequest) -> Envelope:
        """The answer's text and the assessment's log-probability, stored together."""
        return guard_answer(raw, _raw_prompt(request))

    def echoes(self, request: ModelRequest) -> list[str]:
        """The post, alone or inside its prompt: a provider may echo either."""
        sent = request.messages[-1]["content"] if request.messages else ""
        post = post_in_prompt(sent) if _raw_prompt(request) else None
        return [t for t in (sent, post) if t]
