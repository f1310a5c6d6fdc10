"""A local HTTP server speaking OpenAI's chat-completions and moderations formats, and the
guard models as vLLM serves them (Llama Guard 3/4 on chat and legacy completions,
gpt-oss-safeguard with its analysis apart), with limits and faults.

Used by tests, demos and benchmarks in place of a real provider::

    with Simulator(SimConfig(rpm=3000, seed=7)) as sim:
        client = httpx.Client(base_url=sim.base_url)
        ...
        sim.meter.snapshot().billed_tokens_total

Hostile modes (all off by default) copy what real providers and gateways do: over-billing
(``prompt_token_factor``), other ``usage`` shapes, 401/403/404 refusals, Retry-After forms,
refused, hung or lagging batch creates, and error messages that echo the request. The guard
models' quirks (``guard_*``, ``safeguard_*``) are off by default too.
"""

from backfill_assets.providersim.args import add_cli_arguments, config_from_args
from backfill_assets.providersim.billing.meter import (
    BilledCall,
    EndpointBill,
    KeyBill,
    Meter,
    MeterSnapshot,
)
from backfill_assets.providersim.config import (
    FAULT_KINDS,
    FORBID_MODES,
    MODERATION_CATEGORIES,
    RETRY_AFTER_FORMATS,
    SAFEGUARD_REASONING_FIELDS,
    USAGE_SHAPES,
    FaultKind,
    FaultRule,
    SimConfig,
    UsageShape,
)
from backfill_assets.providersim.guard_models.llama_guard import LLAMA_GUARD_CATEGORIES
from backfill_assets.providersim.guard_models.safeguard import REASONING_TOKENS_BY_EFFORT
from backfill_assets.providersim.runner import Simulator, run_forever

__all__ = [
    "FAULT_KINDS",
    "FORBID_MODES",
    "LLAMA_GUARD_CATEGORIES",
    "MODERATION_CATEGORIES",
    "REASONING_TOKENS_BY_EFFORT",
    "RETRY_AFTER_FORMATS",
    "SAFEGUARD_REASONING_FIELDS",
    "USAGE_SHAPES",
    "BilledCall",
    "EndpointBill",
    "FaultKind",
    "FaultRule",
    "KeyBill",
    "Meter",
    "MeterSnapshot",
    "SimConfig",
    "Simulator",
    "UsageShape",
    "add_cli_arguments",
    "config_from_args",
    "run_forever",
]
