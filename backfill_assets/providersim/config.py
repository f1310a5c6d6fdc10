"""Simulator configuration: rate limits, latency, the fault plan and hostile modes (validated).

Every hostile mode is off by default: ``SimConfig()`` answers exactly as before they existed.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from backfill_assets.providersim.corpus import DEFAULT_ACCURACY, Accuracy, CorpusFile

FaultKind = Literal[
    "500",
    "502",
    "503",
    "429",
    "400",
    "timeout",
    "reset",
    "malformed",
    "unknown_label",
    "bad_confidence",
    "wrong_key",
    "401",
    "403",
    "404",
]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
# How ``usage`` is reported (see usage.py); "plain" is the simulator's historical shape.
UsageShape = Literal[
    "plain", "full", "details_null", "completion_null", "total_only", "none", "anthropic"
]
USAGE_SHAPES: tuple[str, ...] = get_args(UsageShape)
# How a 429 says when to come back; "both" sends ``retry-after`` and ``retry-after-ms``.
RetryAfterFormat = Literal["both", "seconds", "ms", "http_date", "huge", "none"]
RETRY_AFTER_FORMATS: tuple[str, ...] = get_args(RetryAfterFormat)
# Why every request is refused with 403 ("off": never).
ForbidMode = Literal["off", "region", "permission"]
FORBID_MODES: tuple[str, ...] = get_args(ForbidMode)
DEFAULT_MODELS: tuple[str, ...] = (
    "gpt-4o-mini",
    "gpt-4.1-mini",
    "gpt-4.1-nano",
    "omni-moderation-latest",
    "text-moderation-latest",
    # Guard models as vLLM serves them (guard_models/), by short and Hugging Face name.
    "llama-guard-3-8b",
    "llama-guard-4-12b",
    "gpt-oss-safeguard-20b",
    "gpt-oss-safeguard-120b",
    "meta-llama/Llama-Guard-3-8B",
    "meta-llama/Llama-Guard-4-12B",
    "openai/gpt-oss-safeguard-20b",
    "openai/gpt-oss-safeguard-120b",
)
# The simulator's own prices, USD per 1M tokens: (input, cached input, output). vLLM has no
# prompt-cache discount, so the guard models' cached price is their input price.
DEFAULT_PRICES: dict[str, tuple[str, str, str]] = {
    "gpt-4o-mini": ("0.15", "0.075", "0.60"),
    "llama-guard-3-8b": ("0.20", "0.20", "0.20"),
    "llama-guard-4-12b": ("0.20", "0.20", "0.20"),
    "gpt-oss-safeguard-20b": ("0.075", "0.075", "0.30"),
    "gpt-oss-safeguard-120b": ("0.18", "0.18", "0.60"),
    "meta-llama/Llama-Guard-3-8B": ("0.20", "0.20", "0.20"),
    "meta-llama/Llama-Guard-4-12B": ("0.20", "0.20", "0.20"),
    "openai/gpt-oss-safeguard-20b": ("0.075", "0.075", "0.30"),
    "openai/gpt-oss-safeguard-120b": ("0.18", "0.18", "0.60"),
}
# Where vLLM's gpt-oss reasoning parser puts the analysis: older versions, then newer ones.
SafeguardReasoningField = Literal["reasoning_content", "reasoning"]
SAFEGUARD_REASONING_FIELDS: tuple[str, ...] = get_args(SafeguardReasoningField)
# The 13 categories of omni-moderation, in OpenAI's order (see moderations.py).
MODERATION_CATEGORIES: tuple[str, ...] = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)
_HEX = frozenset("0123456789abcdef")


def _known_pins(pins: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    # A pin keyed by the text itself, or a misspelt category, would silently never apply.
    for key, scores in pins.items():
        if len(key) != 64 or not set(key) <= _HEX:
            raise ValueError(f"moderation_scores keys are sha256 hex digests, got {key!r}")
        for category, score in scores.items():
            if category not in MODERATION_CATEGORIES:
                raise ValueError(f"unknown moderation category {category!r}")
            if not (math.isfinite(score) and 0.0 <= score <= 1.0):
                raise ValueError(f"moderation score must be within [0, 1], got {score!r}")
    return pins


# sha256 hex of a text -> {category: score}; see SimConfig.moderation_scores.
ModerationPins = Annotated[dict[str, dict[str, float]], AfterValidator(_known_pins)]


def _hex_keys(pins: dict[str, str]) -> dict[str, str]:
    for key in pins:
        if len(key) != 64 or not set(key) <= _HEX:
            raise ValueError(f"guard_answers keys are sha256 hex digests, got {key!r}")
    return pins


# sha256 hex of a post -> the exact answer text; see SimConfig.guard_answers.
GuardPins = Annotated[dict[str, str], AfterValidator(_hex_keys)]


class FaultRule(BaseModel):
    """Inject ``kind`` into a fraction ``rate`` of accepted requests."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: FaultKind = Field(description="What goes wrong (HTTP status or misbehaviour).")
    rate: float = Field(ge=0.0, le=1.0, description="Probability that the rule fires.")
    sticky: bool = Field(
        default=False,
        description="Decide once per correlation id, so every retry of a key fails alike.",
    )


class SimConfig(BaseModel):
    """Everything that shapes the simulator's behaviour; the same config and seed replay alike."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rpm: int = Field(default=0, ge=0, description="Requests per minute; 0 means unlimited.")
    tpm: int = Field(default=0, ge=0, description="Tokens per minute; 0 means unlimited.")
    burst_seconds: float = Field(
        default=1.0, gt=0.0, description="Bucket capacity in seconds of refill (limit/60 * this)."
    )
    latency_median_ms: float = Field(
        default=0.0, ge=0.0, description="Median of the lognormal latency; 0 means none."
    )
    latency_sigma: float = Field(default=0.0, ge=0.0, description="Lognormal sigma of latency.")
    seed: int = Field(default=0, description="Seeds latency draws and fault decisions.")
    faults: tuple[FaultRule, ...] = Field(
        default=(), description="Fault rules checked in order; the first that fires wins."
    )
    fault_by_key: dict[str, FaultKind] = Field(
        default_factory=dict,
        description="Correlation id -> fault that always fires for it (pinpoint tests).",
    )
    hang_seconds: float = Field(
        default=30.0, ge=0.0, description="How long a 'timeout' fault holds the request."
    )
    api_key: str | None = Field(
        default=None, description="If set, requests need 'Authorization: Bearer <key>'."
    )
    models: tuple[str, ...] = Field(
        default=DEFAULT_MODELS,
        description="Listed by GET /v1/models; any model is accepted unless strict_models.",
    )
    strict_models: bool = Field(
        default=False,
        description="A model not in 'models' gets 404 'model_not_found' (chat, batch create).",
    )
    forbid: ForbidMode = Field(
        default="off",
        description="Answer every /v1 request 403: 'region' (unsupported_country_region_"
        "territory, as OpenAI) or 'permission' (permission_error, as gateways).",
    )
    prompt_token_factor: float = Field(
        default=1.0,
        gt=0.0,
        allow_inf_nan=False,
        description="Billed prompt tokens = ceil(own count * factor), in usage, meter and TPM.",
    )
    usage_shape: UsageShape = Field(
        default="plain",
        description="Shape of a chat answer's 'usage' (the meter always bills the true total).",
    )
    usage_shape_mix: tuple[UsageShape, ...] = Field(
        default=(),
        description="If set, each correlation id draws its usage shape from these (by seed).",
    )
    retry_after_format: RetryAfterFormat = Field(
        default="both", description="How 429 answers say when to retry (see limits.py)."
    )
    reset_headers_on_5xx: bool = Field(
        default=False,
        description="5xx answers carry x-ratelimit-remaining-* 0 and reset-* '6m0s' headers.",
    )
    flex_unavailable_share: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Share of flex requests (service_tier flex) answered 429 "
        "resource_unavailable, drawn per key and attempt (1.0: flex is down).",
    )
    prices: dict[str, tuple[str, str, str]] = Field(
        default_factory=lambda: dict(DEFAULT_PRICES),
        description="The simulator's own price list, USD per 1M tokens at the standard tier: "
        "model -> (input, cached input, output); flex and batch bill half. Its meter prices "
        "every billed call with it, independently of the client's table.",
    )
    cached_prefix_tokens: int = Field(
        default=0,
        ge=0,
        description="Prompt caching: this many leading prompt tokens of every call (at most the "
        "prompt, in 128-token steps from 1,024 as OpenAI caches) are read from cache: reported "
        "in the usage (full and anthropic shapes) and billed in the meter as cached.",
    )
    echo_errors: bool = Field(
        default=False,
        description="Error messages about a request quote its user message verbatim.",
    )
    moderation_scores: ModerationPins = Field(
        default_factory=dict,
        description="Pinned moderation scores: sha256 hex of an input text (UTF-8) -> "
        "{category: score in [0, 1]}; the named categories replace the computed scores of "
        "that text on POST /v1/moderations (and in batch lines), the others stay computed.",
    )
    corpus: CorpusFile | None = Field(
        default=None,
        description="The truth of a corpus (corpus.py's corpus.json, parsed, or its path): a "
        "post in it is answered (chat-json, moderations) by its true label, right as often as "
        "'accuracy' says; a post not in it as without it.",
    )
    accuracy: dict[str, Accuracy] = Field(
        default_factory=lambda: dict(DEFAULT_ACCURACY),
        description="Model name or prefix (the longest wins) -> the probability it answers a "
        "corpus post's true label, per difficulty; a model not listed: corpus.CHEAP.",
    )
    guard_answers: GuardPins = Field(
        default_factory=dict,
        description="Pinned Llama Guard answers: sha256 hex of a post (UTF-8) -> the exact "
        "answer text (e.g. 'unsafe\\nS2', or malformed text), sent verbatim on both routes "
        "(no guard_* switch applies to it; faults still do). See guard_models/llama_guard.py.",
    )
    guard_whitespace: bool = Field(
        default=False,
        description="Llama Guard answers come wrapped in blank lines and spaces "
        "('\\n\\n unsafe\\nS1 \\n').",
    )
    guard_case: bool = Field(
        default=False,
        description="Llama Guard's assessment word is capitalised or upper-case ('Unsafe', "
        "'SAFE'), drawn per post.",
    )
    guard_third_line: bool = Field(
        default=False,
        description="Unsafe Llama Guard answers carry a third line after the codes: the "
        "violated categories' names.",
    )
    guard_unknown_code: bool = Field(
        default=False,
        description="Unsafe Llama Guard answers list an unknown code after the real ones "
        "('unsafe\\nS1,S99').",
    )
    safeguard_reasoning_field: SafeguardReasoningField = Field(
        default="reasoning_content",
        description="The message field gpt-oss-safeguard's analysis is sent in: "
        "'reasoning_content' (vLLM until 0.10) or 'reasoning' (later vLLM).",
    )
    safeguard_content_null: bool = Field(
        default=False,
        description="gpt-oss-safeguard: content null, the final JSON answer is the whole "
        "reasoning field (the reasoning parser took the final channel for analysis).",
    )
    safeguard_answer_in_reasoning: bool = Field(
        default=False,
        description="gpt-oss-safeguard: content null, the final JSON answer at the end of the "
        "reasoning prose.",
    )
    safeguard_prose_only: bool = Field(
        default=False,
        description="gpt-oss-safeguard: content null, reasoning prose only, naming a label but "
        "holding no JSON object.",
    )
    safeguard_unenforced: bool = Field(
        default=False,
        description="gpt-oss-safeguard: structured output not enforced, the content is the "
        "JSON answer wrapped in prose or in a ```json fence (drawn per post).",
    )
    safeguard_no_reasoning_usage: bool = Field(
        default=False,
        description="gpt-oss-safeguard: usage without completion_tokens_details (so without "
        "reasoning_tokens).",
    )
    default_max_tokens: int = Field(
        default=64, gt=0, description="Token reservation when a request sets no max tokens."
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024, gt=0, description="Larger request bodies get a 413."
    )
    # Files and Batch APIs (see batches.py). Times are milliseconds so tests stay fast; a real
    # provider takes minutes to hours. Line-level failures reuse ``faults``/``fault_by_key``.
    batch_validating_ms: float = Field(default=5.0, ge=0.0, description="Time in 'validating'.")
    batch_processing_ms: float = Field(
        default=50.0, ge=0.0, description="Time in 'in_progress' for a whole batch file."
    )
    batch_finalizing_ms: float = Field(default=5.0, ge=0.0, description="Time in 'finalizing'.")
    batch_cancel_ms: float = Field(
        default=0.0,
        ge=0.0,
        description="Extra time a cancelled batch stays 'cancelling' (its requests in flight "
        "finishing, up to 10 minutes at OpenAI); 0: as long as 'finalizing', inf: for ever.",
    )
    batch_expire_count: int = Field(
        default=0, ge=0, description="The first N batches created expire before they finish."
    )
    batch_expire_finished_share: float = Field(
        default=0.7,
        ge=0.0,
        le=1.0,
        description="Share of an expiring batch's lines that finished (and are billed).",
    )
    batch_fail_count: int = Field(
        default=0, ge=0, description="The first N batches created fail validation (simulated)."
    )
    enqueued_token_limit: int = Field(
        default=0,
        ge=0,
        description="Prompt tokens of in-progress batches allowed at once; 0 means unlimited.",
    )
    batch_poll_rpm: int = Field(
        default=0, ge=0, description="Batch retrieve/list requests per minute; 0 means unlimited."
    )
    batch_max_lines: int = Field(default=50_000, gt=0, description="Requests per batch file.")
    batch_max_file_bytes: int = Field(
        default=200 * 1024 * 1024, gt=0, description="Size limit of a batch input file."
    )
    batch_create_token_limit_count: int = Field(
        default=0,
        ge=0,
        description="The first N batch creates are answered 400 'token_limit_exceeded'.",
    )
    batch_create_hang_count: int = Field(
        default=0,
        ge=0,
        description="The first N batches are created but their create answer is withheld for "
        "hang_seconds, then the connection closes.",
    )
    batch_list_lag_ms: float = Field(
        default=0.0,
        ge=0.0,
        allow_inf_nan=False,
        description="GET /v1/batches omits batches younger than this (retrieve sees them).",
    )
    batch_usage_shape: UsageShape = Field(
        default="plain", description="Shape of 'usage' in batch output lines ('none': absent)."
    )
    batch_chunk_metadata_key: str = Field(
        default="chunk_id", description="Batch metadata key whose creates the meter counts."
    )
