"""Command-line options of ``backfill-moderation provider-sim``."""

from __future__ import annotations

import argparse
import math
from decimal import Decimal

from backfill_assets.providersim.config import (
    DEFAULT_MODELS,
    FAULT_KINDS,
    FORBID_MODES,
    RETRY_AFTER_FORMATS,
    SAFEGUARD_REASONING_FIELDS,
    USAGE_SHAPES,
    FaultRule,
    SimConfig,
)


def _rule(value: str, *, sticky: bool) -> FaultRule:
    kind, sep, rate_text = value.partition("=")
    if not sep or kind not in FAULT_KINDS:
        kinds = ", ".join(FAULT_KINDS)
        raise argparse.ArgumentTypeError(f"expected KIND=RATE with KIND one of {kinds}: {value!r}")
    try:
        rate = float(rate_text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"rate must be a number: {value!r}") from None
    if not 0.0 <= rate <= 1.0:
        raise argparse.ArgumentTypeError(f"rate must be within [0, 1]: {value!r}")
    return FaultRule.model_validate({"kind": kind, "rate": rate, "sticky": sticky})


def _fault(value: str) -> FaultRule:
    return _rule(value, sticky=False)


def _sticky_fault(value: str) -> FaultRule:
    return _rule(value, sticky=True)


def _count(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {value!r}")
    return number


def _seconds(value: str) -> float:
    number = float(value)
    if not (number >= 0.0 and math.isfinite(number)):  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0: {value[:40]!r}")
    return number


def _port(value: str) -> int:
    number = int(value)
    if not 0 <= number <= 65_535:
        raise argparse.ArgumentTypeError(f"must be a port, 0 to 65535: {value[:40]!r}")
    return number


def _share(value: str) -> float:
    number = float(value)
    if not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError(f"must be within [0, 1]: {value!r}")
    return number


def _price(value: str) -> tuple[str, tuple[str, str, str]]:
    model, _, rest = value.partition("=")
    parts = rest.split(",")
    try:
        if not model or len(parts) != 3 or any(Decimal(p) < 0 for p in parts):
            raise ValueError(value)
    except (ArithmeticError, ValueError):
        raise argparse.ArgumentTypeError(f"expected MODEL=IN,CACHED,OUT, got {value!r}") from None
    return model, (parts[0], parts[1], parts[2])


def _accuracy(value: str) -> tuple[str, dict[str, float]]:
    model, _, rest = value.partition("=")
    parts = rest.split(",")
    try:
        shares = [float(p) for p in parts]
        if not model or len(parts) != 3 or not all(0.0 <= p <= 1.0 for p in shares):
            raise ValueError(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected MODEL=EASY,MEDIUM,HARD, each within [0, 1], got {value!r}"
        ) from None
    return model, dict(zip(("easy", "medium", "hard"), shares, strict=True))


def _positive_seconds(value: str) -> float:
    number = _seconds(value)
    if number == 0.0:
        raise argparse.ArgumentTypeError(f"must be > 0: {value!r}")
    return number


def _factor(value: str) -> float:
    number = float(value)
    if not (number > 0.0 and math.isfinite(number)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0: {value!r}")
    return number


def _names(value: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in value.split(",") if part.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list: {value!r}")
    return names


def _shapes(value: str) -> tuple[str, ...]:
    shapes = _names(value)
    unknown = [shape for shape in shapes if shape not in USAGE_SHAPES]
    if unknown:
        allowed = ", ".join(USAGE_SHAPES)
        raise argparse.ArgumentTypeError(f"unknown usage shape {unknown[0]!r} (one of {allowed})")
    return shapes


def _add_hostile_arguments(parser: argparse.ArgumentParser) -> None:
    hostile = parser.add_argument_group("Hostile provider (all off by default)")
    hostile.add_argument(
        "--models",
        type=_names,
        default=None,
        help=f"comma-separated model list (default: {','.join(DEFAULT_MODELS)})",
    )
    hostile.add_argument(
        "--strict-models",
        action="store_true",
        help="answer a model outside --models with 404 model_not_found",
    )
    hostile.add_argument(
        "--forbid",
        choices=FORBID_MODES,
        default="off",
        help="answer every /v1 request 403 (region: OpenAI's country block; permission)",
    )
    hostile.add_argument(
        "--prompt-token-factor",
        type=_factor,
        default=1.0,
        help="bill ceil(prompt tokens x this) (over-billing tokenizer)",
    )
    hostile.add_argument(
        "--usage-shape", choices=USAGE_SHAPES, default="plain", help="shape of chat 'usage'"
    )
    hostile.add_argument(
        "--usage-shape-mix",
        type=_shapes,
        default=(),
        metavar="SHAPE,SHAPE,...",
        help="draw each key's usage shape from these (by --seed)",
    )
    hostile.add_argument(
        "--retry-after-format",
        choices=RETRY_AFTER_FORMATS,
        default="both",
        help="how 429s say when to retry",
    )
    hostile.add_argument(
        "--reset-headers-on-5xx",
        action="store_true",
        help="5xx answers claim every limit exhausted for 6m0s",
    )
    hostile.add_argument(
        "--echo-errors",
        action="store_true",
        help="error messages quote the request's user message verbatim",
    )
    hostile.add_argument(
        "--flex-unavailable-share",
        type=_share,
        default=0.0,
        metavar="SHARE",
        help="share of flex requests answered 429 resource_unavailable (1.0: flex is down)",
    )
    hostile.add_argument(
        "--price",
        action="append",
        default=[],
        type=_price,
        metavar="MODEL=IN,CACHED,OUT",
        help="the meter's own standard price, USD per 1M tokens (flex and batch: half); "
        "repeatable; gpt-4o-mini=0.15,0.075,0.60 is built in",
    )
    hostile.add_argument(
        "--cached-prefix-tokens",
        type=_count,
        default=0,
        metavar="N",
        help="prompt caching: the first N prompt tokens of a call are read from cache "
        "(reported in the full and anthropic usage shapes, billed as cached)",
    )


# Boolean switches of the guard dialects: flag -> what it does (dest: the SimConfig field).
_GUARD_SWITCHES = {
    "--guard-whitespace": "Llama Guard answers wrapped in blank lines and spaces",
    "--guard-case": "Llama Guard's assessment capitalised or upper-case (Unsafe, SAFE)",
    "--guard-third-line": "unsafe Llama Guard answers carry a third line (the categories' names)",
    "--guard-unknown-code": "unsafe Llama Guard answers list an unknown code (S1,S99)",
    "--safeguard-content-null": "gpt-oss-safeguard: content null, the JSON answer is the "
    "whole reasoning",
    "--safeguard-answer-in-reasoning": "gpt-oss-safeguard: content null, the JSON answer at "
    "the end of the reasoning",
    "--safeguard-prose-only": "gpt-oss-safeguard: content null, reasoning prose only",
    "--safeguard-unenforced": "gpt-oss-safeguard: the JSON answer in a ```json fence or prose",
    "--safeguard-no-reasoning-usage": "gpt-oss-safeguard: usage without completion_tokens_details",
}


def _add_guard_arguments(parser: argparse.ArgumentParser) -> None:
    guard = parser.add_argument_group("Guard models behind vLLM (all off by default)")
    for flag, help_text in _GUARD_SWITCHES.items():
        guard.add_argument(flag, action="store_true", help=help_text)
    guard.add_argument(
        "--safeguard-reasoning-field",
        choices=SAFEGUARD_REASONING_FIELDS,
        default="reasoning_content",
        help="the message field gpt-oss-safeguard's analysis is sent in",
    )


def _guard_settings(ns: argparse.Namespace) -> dict[str, object]:
    """The guard dialects' SimConfig fields, named as their flags."""
    names = [flag[2:].replace("-", "_") for flag in _GUARD_SWITCHES]
    return {
        **{name: getattr(ns, name) for name in names},
        "safeguard_reasoning_field": ns.safeguard_reasoning_field,
    }


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's options; ``--fault`` and ``--fault-sticky`` keep their given order."""
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind")
    parser.add_argument("--port", type=_port, default=8799, help="port to bind (0: any free)")
    parser.add_argument("--rpm", type=_count, default=0, help="requests per minute (0: unlimited)")
    parser.add_argument("--tpm", type=_count, default=0, help="tokens per minute (0: unlimited)")
    parser.add_argument(
        "--burst-seconds",
        type=_positive_seconds,
        default=1.0,
        help="bucket size in seconds of refill",
    )
    parser.add_argument("--latency-ms", type=_seconds, default=0.0, help="median latency (ms)")
    parser.add_argument("--latency-sigma", type=_seconds, default=0.0, help="lognormal sigma")
    parser.add_argument("--seed", type=int, default=0, help="seed for latency and faults")
    parser.add_argument(
        "--fault",
        dest="faults",
        action="append",
        type=_fault,
        metavar="KIND=RATE",
        help="inject a fault into a fraction of attempts (repeatable)",
    )
    parser.add_argument(
        "--fault-sticky",
        dest="faults",
        action="append",
        type=_sticky_fault,
        metavar="KIND=RATE",
        help="like --fault, but every attempt of an affected key fails alike",
    )
    parser.add_argument(
        "--hang-seconds", type=_seconds, default=30.0, help="how long a 'timeout' fault hangs"
    )
    parser.add_argument("--api-key", default=None, help="require this bearer token")
    batch = parser.add_argument_group("Batch API")
    batch.add_argument(
        "--batch-processing-ms", type=_seconds, default=50.0, help="time a batch is in_progress"
    )
    batch.add_argument(
        "--batch-cancel-ms",
        type=_seconds,
        default=0.0,
        help="extra time a cancelled batch stays 'cancelling' (0: as long as finalizing)",
    )
    batch.add_argument(
        "--batch-expire-count", type=_count, default=0, help="the first N batches expire"
    )
    batch.add_argument(
        "--batch-expire-finished-share",
        type=_share,
        default=0.7,
        help="share of an expiring batch's lines that finished",
    )
    batch.add_argument("--enqueued-token-limit", type=_count, default=0, help="0: unlimited")
    batch.add_argument(
        "--batch-poll-rpm", type=_count, default=0, help="status polls per minute (0: unlimited)"
    )
    batch.add_argument(
        "--batch-create-token-limit-count",
        type=_count,
        default=0,
        help="answer the first N creates 400 token_limit_exceeded",
    )
    batch.add_argument(
        "--batch-create-hang-count",
        type=_count,
        default=0,
        help="create the first N batches but withhold the answer for --hang-seconds",
    )
    batch.add_argument(
        "--batch-list-lag-ms",
        type=_seconds,
        default=0.0,
        help="GET /v1/batches omits batches younger than this",
    )
    batch.add_argument(
        "--batch-usage-shape", choices=USAGE_SHAPES, default="plain", help="usage in output lines"
    )
    _add_hostile_arguments(parser)
    _add_guard_arguments(parser)
    corpus = parser.add_argument_group("Corpus (answers by true label; docs/providers.md)")
    corpus.add_argument("--corpus", metavar="FILE", help="corpus.json of providersim.corpus")
    corpus.add_argument(
        "--accuracy",
        action="append",
        default=[],
        type=_accuracy,
        metavar="MODEL=EASY,MEDIUM,HARD",
        help="how often a model (or a name prefix) answers a corpus post's true label, per "
        "difficulty; repeatable, over the built-in table",
    )


def config_from_args(ns: argparse.Namespace) -> SimConfig:
    """The ``SimConfig`` described by parsed options (host and port are read by the caller)."""
    return SimConfig(
        rpm=ns.rpm,
        tpm=ns.tpm,
        burst_seconds=ns.burst_seconds,
        latency_median_ms=ns.latency_ms,
        latency_sigma=ns.latency_sigma,
        seed=ns.seed,
        faults=tuple(ns.faults or ()),
        hang_seconds=ns.hang_seconds,
        api_key=ns.api_key,
        batch_processing_ms=ns.batch_processing_ms,
        batch_cancel_ms=ns.batch_cancel_ms,
        batch_expire_count=ns.batch_expire_count,
        batch_expire_finished_share=ns.batch_expire_finished_share,
        enqueued_token_limit=ns.enqueued_token_limit,
        batch_poll_rpm=ns.batch_poll_rpm,
        models=ns.models or DEFAULT_MODELS,
        strict_models=ns.strict_models,
        forbid=ns.forbid,
        prompt_token_factor=ns.prompt_token_factor,
        usage_shape=ns.usage_shape,
        usage_shape_mix=ns.usage_shape_mix,
        retry_after_format=ns.retry_after_format,
        reset_headers_on_5xx=ns.reset_headers_on_5xx,
        echo_errors=ns.echo_errors,
        cached_prefix_tokens=ns.cached_prefix_tokens,
        flex_unavailable_share=ns.flex_unavailable_share,
        **({"prices": {**SimConfig().prices, **dict(ns.price)}} if ns.price else {}),
        batch_create_token_limit_count=ns.batch_create_token_limit_count,
        batch_create_hang_count=ns.batch_create_hang_count,
        batch_list_lag_ms=ns.batch_list_lag_ms,
        batch_usage_shape=ns.batch_usage_shape,
        **_guard_settings(ns),
        corpus=ns.corpus,
        **({"accuracy": {**SimConfig().accuracy, **dict(ns.accuracy)}} if ns.accuracy else {}),
    )
