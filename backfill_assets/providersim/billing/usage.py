"""Billed prompt tokens and the shapes in which real servers report ``usage`` (pure).

What the simulator bills never depends on the shape: the meter always books the true prompt
and completion tokens. Only what the client is told changes::

    plain            {"prompt_tokens", "completion_tokens", "total_tokens"}
    full             plain + prompt_tokens_details {cached_tokens, audio_tokens}
                     + completion_tokens_details {reasoning_tokens (a quarter of the
                       completion), audio_tokens,
                       accepted_prediction_tokens, rejected_prediction_tokens} (OpenAI today)
    details_null     plain + both *_details set to null (vLLM, Ollama and other servers)
    completion_null  completion_tokens null beside a correct total
    total_only       {"total_tokens"} alone
    none             no usage object at all
    anthropic        {"input_tokens" (uncached), "output_tokens", "cache_read_input_tokens",
                      "cache_creation_input_tokens"} as Anthropic-style gateways send
"""

from __future__ import annotations

import math
from typing import Any

from backfill_assets.providersim.config import SimConfig, UsageShape
from backfill_assets.providersim.faults import unit_draw


def billed_prompt(count: int, factor: float) -> int:
    """``ceil(count * factor)``: the prompt tokens billed for ``count`` counted ones."""
    return count if factor == 1.0 else math.ceil(count * factor)


def cached_tokens(prompt: int, prefix: int) -> int:
    """Of ``prompt`` tokens, those read from cache: OpenAI caches prompts of 1,024 tokens and
    more, in steps of 128, up to the shared prefix."""
    shared = min(prompt, prefix)
    return 0 if shared < 1024 else 1024 + (shared - 1024) // 128 * 128


def usage_body(
    shape: UsageShape, prompt: int, completion: int, cached: int = 0
) -> dict[str, Any] | None:
    """The ``usage`` object in ``shape``; None when the answer carries none."""
    total = prompt + completion
    if shape == "none":
        return None
    if shape == "anthropic":
        return {
            "input_tokens": prompt - cached,
            "output_tokens": completion,
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0,
        }
    if shape == "total_only":
        return {"total_tokens": total}
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": None if shape == "completion_null" else completion,
        "total_tokens": total,
    }
    if shape == "full":
        usage["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
        usage["completion_tokens_details"] = {
            # Part of completion_tokens, as a reasoning model reports it.
            "reasoning_tokens": completion // 4,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        }
    elif shape == "details_null":
        usage["prompt_tokens_details"] = None
        usage["completion_tokens_details"] = None
    return usage


def chat_usage_shape(config: SimConfig, correlation_id: str) -> UsageShape:
    """The shape for a chat answer: drawn per key from ``usage_shape_mix`` if set."""
    mix = config.usage_shape_mix
    if not mix:
        return config.usage_shape
    # Per key, not per attempt: every retry of a key sees the same shape.
    return mix[int(unit_draw(config.seed, "usage_shape", correlation_id) * len(mix))]
