"""gpt-oss-safeguard behind vLLM: the ``safeguard`` dialect's adapter.

The request is the chat-json one (the policy as the system message, the framed post, the
policy's JSON schema as ``response_format``, which vLLM may or may not enforce) with
``reasoning_effort`` and a generous output bound (``BACKFILL_SAFEGUARD_MAX_OUTPUT_TOKENS``,
reserved by budgets: a long reasoning is paid for, not cut). The answer is taken from the final
channel, or from the reasoning where the server put it there (``safeguard_wire.py``); reasoning
tokens are part of the completion tokens booked.
"""

from __future__ import annotations

from typing import Any

from backfill_assets.config.variables import ModelSettings
from backfill_assets.domain.money.prices import Tier
from backfill_assets.providers.models.base import ModelRequest
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.providers.models.openai_wire import Envelope, request_body
from backfill_assets.providers.models.safeguard_wire import safeguard_answer


class SafeguardModel(OpenAIHttpModel):
    """gpt-oss-safeguard through vLLM's OpenAI-compatible server (standard tier only)."""

    name = "safeguard"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        settings: ModelSettings = kw.get("settings") or ModelSettings()
        self.reasoning_effort = settings.reasoning_effort

    def body(self, request: ModelRequest, tier: Tier) -> dict[str, Any]:
        """The chat-json request, with the reasoning effort."""
        return {
            **request_body(request, self._max_tokens_param, tier, self._logprobs),
            "reasoning_effort": self.reasoning_effort,
        }

    def envelope(self, raw: bytes, request: ModelRequest) -> Envelope:
        """The final answer, wherever the server put it, and where that was."""
        return safeguard_answer(raw)
