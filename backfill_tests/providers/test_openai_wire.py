"""Pure parsing of the OpenAI wire format: bodies, Retry-After, limits, safe error summaries."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from backfill_assets.domain.money.prices import PriceError, PriceTable, Tier
from backfill_assets.domain.policy.output_gate import ModerationOutput
from backfill_assets.domain.policy.rubric import MAX_OUTPUT_TOKENS
from backfill_assets.providers.models.base import ModelRequest, TransportRejected
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.providers.models.openai_wire import (
    NotACompletion,
    advertised_limits,
    error_summary,
    parse_completion,
    parse_duration,
    request_body,
    retry_after_seconds,
    scrub,
)
from backfill_assets.providers.ratelimit import AdvertisedLimits, EndpointLimiter, LimiterConfig
from backfill_tests.providers.conftest import RUBRIC

KEY = "a" * 64
POST = "My neighbour Cornelius Vandermeer keeps parking across my driveway every night"


def _request(text: str = POST) -> ModelRequest:
    return ModelRequest(
        key=KEY,
        tenant_id="acme",
        post_id="p1",
        attempt=1,
        model="gpt-4o-mini-2024-07-18",
        messages=RUBRIC.messages(KEY, text),
        max_output_tokens=MAX_OUTPUT_TOKENS,
        estimated_tokens=500,
        contract=RUBRIC.contract,
    )


def test_request_body_is_one_post_with_a_strict_schema_from_the_output_model() -> None:
    body = request_body(_request(), "max_completion_tokens", Tier.STANDARD, logprobs=False)
    assert body["model"] == "gpt-4o-mini-2024-07-18" and "logprobs" not in body
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][0]["content"] == RUBRIC.system_prompt
    assert f"<post>\n{POST}\n</post>" in body["messages"][1]["content"]
    assert body["max_completion_tokens"] == MAX_OUTPUT_TOKENS and "max_tokens" not in body
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    schema = fmt["json_schema"]["schema"]
    # The strict schema and the pydantic model describe the same object.
    assert set(schema["required"]) == set(ModerationOutput.model_fields)
    assert set(schema["properties"]) == set(ModerationOutput.model_fields)
    assert schema["properties"]["label"]["enum"] == list(RUBRIC.policy.label_ids)
    assert schema == RUBRIC.schema
    assert schema["additionalProperties"] is False
    with pytest.raises(ValueError):
        request_body(_request(), "max_output", Tier.STANDARD, logprobs=False)
    # Asked for, the answer's token log-probabilities (the label's probability).
    assert request_body(_request(), "max_tokens", Tier.STANDARD, logprobs=True)["logprobs"] is True


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("20ms", 0.02),
        ("1.5s", 1.5),
        ("6m0s", 360.0),
        ("1h2m3s", 3723.0),
        ("7", 7.0),
        ("0.25", 0.25),
        ("", None),
        ("soon", None),
        ("5x", None),
        ("-3", None),
    ],
)
def test_parse_duration(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


def test_retry_after_forms_and_precedence() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after_seconds({"retry-after": "120"}, now=now) == 120.0  # beyond 60 s
    date = format_datetime(now + timedelta(seconds=90), usegmt=True)
    assert retry_after_seconds({"retry-after": date}, now=now) == 90.0
    past = format_datetime(now - timedelta(seconds=5), usegmt=True)
    assert retry_after_seconds({"retry-after": past}, now=now) == 0.0
    both = {"retry-after": "2", "retry-after-ms": "1500"}
    assert retry_after_seconds(both, now=now) == 1.5
    resets = {
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-remaining-requests": "5",
        "x-ratelimit-reset-tokens": "6m0s",
        "x-ratelimit-remaining-tokens": "0",
    }
    assert retry_after_seconds(resets, now=now) == 360.0  # the exhausted limit's reset
    unclear = {"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "250ms"}
    assert retry_after_seconds(unclear, now=now) == 1.0
    assert retry_after_seconds({}, "Please try again in 820ms.", now=now) == pytest.approx(0.82)
    assert retry_after_seconds({"retry-after": "garbage"}, now=now) is None


def test_advertised_limits() -> None:
    headers = {"x-ratelimit-limit-requests": "3000", "x-ratelimit-limit-tokens": "600000"}
    assert advertised_limits(headers) == AdvertisedLimits(3000, 600000)
    assert advertised_limits({"x-ratelimit-limit-requests": "n/a"}) is None


def test_parse_completion_envelopes() -> None:
    ok = {
        "id": "chatcmpl-1",
        "choices": [{"message": {"content": '{"x":1}'}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
        "system_fingerprint": "fp",
    }
    parsed = parse_completion(json.dumps(ok).encode())
    assert parsed.content == '{"x":1}' and parsed.usage is not None
    refusal = {**ok, "choices": [{"message": {"content": None, "refusal": "no"}}]}
    assert parse_completion(json.dumps(refusal).encode()).content == ""
    # Odd choices, but usage is there: the call is still booked (and then schema-rejected).
    odd = {"usage": {"prompt_tokens": 4, "completion_tokens": 0}, "choices": "?"}
    odd_parsed = parse_completion(json.dumps(odd).encode())
    assert odd_parsed.content == "" and odd_parsed.usage is not None
    for body in (b"<html>ok</html>", b"[1, 2]", b'{"choices": 5}'):
        with pytest.raises(NotACompletion):
            parse_completion(body)


def test_error_summary_keeps_status_type_code_and_drops_echoes_and_secrets() -> None:
    echo = json.dumps(
        {
            "error": {
                "message": f"Invalid content: {POST} is not allowed",
                "type": "invalid_request_error",
                "code": "content_filter",
            }
        }
    ).encode()
    summary, _ = error_summary(400, echo, "application/json", echoes=[POST])
    assert summary.startswith("HTTP 400 invalid_request_error/content_filter: ")
    assert "Cornelius" not in summary and "withheld" in summary
    quoted = json.dumps({"error": {"message": "Invalid value 'Cornelius V.' for messages"}})
    summary, _ = error_summary(400, quoted.encode(), "application/json", echoes=[POST])
    assert "Cornelius" not in summary and "Invalid value" in summary
    key = "sk-proj-abcdef0123456789"
    leak = json.dumps({"error": {"message": f"Incorrect API key provided: {key}."}})
    summary, _ = error_summary(401, leak.encode(), "application/json", secrets=[key])
    assert key not in summary and "sk-proj" not in summary
    html, _ = error_summary(502, b"<html>bad gateway</html>", "text/html; charset=utf-8")
    assert html == "HTTP 502: non-JSON error body (text/html, 24 bytes)"
    assert len(scrub("x" * 5000, [], [])) <= 160


def test_adapter_error_messages_never_carry_the_post_or_key() -> None:
    """The adapter's exception text (stored as the reason) for a provider that echoes input.

    MockTransport here only stands in for a provider's error body; the real HTTP path is
    exercised against the simulator elsewhere.
    """
    key = "sk-live-0123456789abcdef"

    def handler(request: httpx.Request) -> httpx.Response:
        sent = json.loads(request.content)
        text = sent["messages"][-1]["content"]
        return httpx.Response(
            400,
            json={"error": {"message": f"Bad input: {text} (key {key})", "type": "invalid"}},
            headers={"x-request-id": "req_1"},
        )

    limiter = EndpointLimiter(LimiterConfig())
    adapter = OpenAIHttpModel(
        base_url="http://provider.invalid/v1",
        model="m",
        limiter=limiter,
        api_key=key,
        transport=httpx.MockTransport(handler),
    )

    async def call() -> TransportRejected:
        try:
            await adapter.complete(_request())
        except TransportRejected as exc:
            return exc
        finally:
            await adapter.aclose()
        raise AssertionError("expected TransportRejected")

    exc = asyncio.run(call())
    assert exc.status == 400 and exc.request_id == "req_1"
    assert "Cornelius" not in str(exc) and key not in str(exc) and KEY not in str(exc)


def test_price_table() -> None:
    table = PriceTable.from_json('{"my-model": {"input": 1.0, "output": 2.0}}')
    # Nano-dollars, exactly: 1M in at $1 plus 0.5M out at $2.
    assert table.cost("my-model", 1_000_000, 500_000) == 2_000_000_000
    # A dated snapshot is priced as its family, and the longest family wins.
    assert table.cost("gpt-4o-mini-2024-07-18", 1_000_000, 0) == 150_000_000
    assert table.cost("gpt-4o-2024-08-06", 1_000_000, 0) == 2_500_000_000
    assert table.cost("unknown", 10, 10) == 0
    for bad in ("[1]", '{"m": {"input": -1, "output": 0}}', '{"m": {"in": 1}}', "{"):
        with pytest.raises(PriceError):
            PriceTable.from_json(bad)
