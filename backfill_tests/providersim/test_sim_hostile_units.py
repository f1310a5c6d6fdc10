"""Pure parts of the hostile modes: key masking, usage shapes, retry hints, billing, CLI flags."""

from __future__ import annotations

import argparse
import shlex

import pydantic
import pytest

from backfill_assets.providersim import SimConfig, add_cli_arguments, config_from_args
from backfill_assets.providersim.access import masked_key
from backfill_assets.providersim.billing.usage import billed_prompt, chat_usage_shape, usage_body
from backfill_assets.providersim.limits import exhausted_headers, retry_after_headers


@pytest.mark.parametrize(
    ("token", "shown"),
    [
        # As OpenAI quotes them: first 8, one asterisk per hidden character, last 4.
        # A legacy 51-character key, as in a real 401 quoted in public bug reports.
        ("sk-zhj0s" + "A" * 39 + "CMuq", "sk-zhj0s" + "*" * 39 + "CMuq"),
        ("sk-proj-abcdefghij1234", "sk-proj-**********1234"),
        ("sk-test-1234", "sk-test-1234"),  # 12 characters or fewer: echoed whole
        ("undefined", "undefined"),
    ],
)
def test_masked_key_matches_openais_quoting(token: str, shown: str) -> None:
    assert masked_key(token) == shown
    assert len(masked_key(token)) == len(token)


def test_usage_body_shapes() -> None:
    assert usage_body("plain", 10, 5) == {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
    }
    assert usage_body("completion_null", 10, 5) == {
        "prompt_tokens": 10,
        "completion_tokens": None,
        "total_tokens": 15,
    }
    assert usage_body("total_only", 10, 5) == {"total_tokens": 15}
    assert usage_body("none", 10, 5) is None
    full = usage_body("full", 10, 5)
    assert full is not None and full["completion_tokens_details"]["reasoning_tokens"] == 1
    nulls = usage_body("details_null", 10, 5)
    assert nulls is not None and nulls["prompt_tokens_details"] is None


def test_chat_usage_shape_uses_the_mix_per_key() -> None:
    assert chat_usage_shape(SimConfig(usage_shape="total_only"), "k") == "total_only"
    config = SimConfig(usage_shape="full", usage_shape_mix=("none", "completion_null"), seed=1)
    drawn = {chat_usage_shape(config, f"{i:064x}") for i in range(50)}
    assert drawn == {"none", "completion_null"}


def test_billed_prompt_rounds_up() -> None:
    assert billed_prompt(100, 1.0) == 100
    assert billed_prompt(100, 3.0) == 300
    assert billed_prompt(7, 1.5) == 11
    assert billed_prompt(1, 0.5) == 1


def test_retry_after_formats() -> None:
    now = 1_700_000_000.25
    assert retry_after_headers(2.4, "seconds", now) == {"retry-after": "3"}
    assert retry_after_headers(2.4, "ms", now) == {"retry-after-ms": "2400"}
    assert retry_after_headers(2.4, "huge", now) == {"retry-after": "1000000000000"}
    assert retry_after_headers(2.4, "none", now) == {}
    # now + 2.4 s rounded up to the second: never earlier than the wait.
    assert retry_after_headers(2.4, "http_date", now) == {
        "retry-after": "Tue, 14 Nov 2023 22:13:23 GMT"
    }


def test_exhausted_headers_say_zero_left_for_six_minutes() -> None:
    assert exhausted_headers({"requests": 500}, 360.0) == {
        "x-ratelimit-limit-requests": "500",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "6m0s",
    }


@pytest.mark.parametrize(
    "bad",
    [
        {"prompt_token_factor": 0},
        {"prompt_token_factor": float("inf")},
        {"usage_shape": "partial"},
        {"usage_shape_mix": ("full", "weird")},
        {"retry_after_format": "minutes"},
        {"forbid": "yes"},
        {"batch_create_hang_count": -1},
        {"batch_list_lag_ms": -5},
        {"batch_usage_shape": "total"},
    ],
)
def test_hostile_settings_are_validated(bad: dict[str, object]) -> None:
    with pytest.raises(pydantic.ValidationError):
        SimConfig.model_validate(bad)


def _parse(argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="provider-sim")
    add_cli_arguments(parser)
    return parser.parse_args(shlex.split(argv))


def test_cli_flags_set_every_hostile_mode() -> None:
    ns = _parse(
        "--models gpt-4o-mini,gpt-x --strict-models --forbid permission "
        "--prompt-token-factor 3 --usage-shape completion_null "
        "--usage-shape-mix full,none,total_only --retry-after-format http_date "
        "--reset-headers-on-5xx --echo-errors --batch-create-token-limit-count 2 "
        "--batch-create-hang-count 1 --batch-list-lag-ms 1500 --batch-usage-shape none "
        "--fault 401=0.1 --fault-sticky 404=0.2"
    )
    config = config_from_args(ns)
    assert config.model_dump(
        include={
            "models",
            "strict_models",
            "forbid",
            "prompt_token_factor",
            "usage_shape",
            "usage_shape_mix",
            "retry_after_format",
            "reset_headers_on_5xx",
            "echo_errors",
            "batch_create_token_limit_count",
            "batch_create_hang_count",
            "batch_list_lag_ms",
            "batch_usage_shape",
        }
    ) == {
        "models": ("gpt-4o-mini", "gpt-x"),
        "strict_models": True,
        "forbid": "permission",
        "prompt_token_factor": 3.0,
        "usage_shape": "completion_null",
        "usage_shape_mix": ("full", "none", "total_only"),
        "retry_after_format": "http_date",
        "reset_headers_on_5xx": True,
        "echo_errors": True,
        "batch_create_token_limit_count": 2,
        "batch_create_hang_count": 1,
        "batch_list_lag_ms": 1500.0,
        "batch_usage_shape": "none",
    }
    assert [(r.kind, r.rate, r.sticky) for r in config.faults] == [
        ("401", 0.1, False),
        ("404", 0.2, True),
    ]


@pytest.mark.parametrize(
    "argv",
    [
        "--prompt-token-factor 0",
        "--prompt-token-factor nan",
        "--usage-shape weird",
        "--usage-shape-mix full,weird",
        "--forbid maybe",
        "--retry-after-format days",
        "--batch-create-hang-count -1",
    ],
)
def test_cli_rejects_bad_hostile_values(argv: str) -> None:
    with pytest.raises(SystemExit):
        _parse(argv)
