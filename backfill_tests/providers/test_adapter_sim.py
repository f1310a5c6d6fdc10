"""The HTTP adapter alone against the simulator over real loopback HTTP."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import pytest

from backfill_assets.domain.money.flex_quota import FlexQuota
from backfill_assets.domain.money.prices import Tier
from backfill_assets.domain.policy.output_gate import parse_output
from backfill_assets.domain.policy.rubric import MAX_OUTPUT_TOKENS, estimate_prompt_tokens
from backfill_assets.domain.work.keys import content_hash, work_key
from backfill_assets.providers.models.base import (
    ModelRequest,
    ModelResponse,
    RetriableError,
    RunFatalError,
    TransportRejected,
)
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.providers.models.timeouts import HttpTimeouts
from backfill_assets.providers.ratelimit import EndpointLimiter, LimiterConfig
from backfill_tests.providers.conftest import (
    API_KEY,
    MODEL,
    RUBRIC,
    VERSIONS,
    AdapterFactory,
    StartSim,
)

TEXT = "Thanks for the detailed write-up, it fixed my build on the first try."


def _request(post_id: str = "p1", text: str = TEXT) -> ModelRequest:
    key = work_key(VERSIONS, "acme", post_id, content_hash(text))
    return ModelRequest(
        key=key,
        tenant_id="acme",
        post_id=post_id,
        attempt=1,
        model=MODEL,
        messages=RUBRIC.messages(key, text),
        max_output_tokens=MAX_OUTPUT_TOKENS,
        estimated_tokens=estimate_prompt_tokens(RUBRIC, text) + MAX_OUTPUT_TOKENS,
        contract=RUBRIC.contract,
    )


def _call(make: Callable[[], OpenAIHttpModel], request: ModelRequest) -> ModelResponse:
    async def go() -> ModelResponse:
        adapter = make()
        try:
            return await adapter.complete(request)
        finally:
            await adapter.aclose()

    return asyncio.run(go())


def _fails(make: Callable[[], OpenAIHttpModel], request: ModelRequest) -> Exception:
    with pytest.raises((RetriableError, TransportRejected, RunFatalError)) as info:
        _call(make, request)
    assert isinstance(info.value, Exception)
    return info.value


def test_answer_usage_request_id_and_cost(start_sim: StartSim, adapter_for: AdapterFactory) -> None:
    sim = start_sim(api_key=API_KEY)
    request = _request()
    response = _call(adapter_for(sim, api_key=API_KEY), request)
    billed = sim.meter.snapshot().billed
    assert list(billed) == [response.request_id]
    call = billed[response.request_id]
    assert (response.tokens_in, response.tokens_out) == (call.prompt_tokens, call.completion_tokens)
    assert response.usage_reported
    # Nano-dollars, exactly: $0.15 and $0.60 per million tokens are 150 and 600 per token.
    assert response.cost_nanos == call.prompt_tokens * 150 + call.completion_tokens * 600
    out = parse_output(response.raw_text, request.key, RUBRIC.contract)
    assert out.label == "ok" and out.correlation_id == request.key


def test_wrong_api_key_is_rejected_without_echoing_it(
    start_sim: StartSim, adapter_for: AdapterFactory
) -> None:
    sim = start_sim(api_key=API_KEY)
    wrong = "sk-wrong-5555666677778888"
    exc = _fails(adapter_for(sim, api_key=wrong), _request())
    # A run-level error, not a key's: the run stops and keys stay pending.
    assert isinstance(exc, RunFatalError) and exc.status == 401
    assert "invalid_api_key" in str(exc) and "BACKFILL_MODEL_API_KEY" in str(exc)
    assert exc.endpoint.endswith("/v1/chat/completions") and exc.endpoint in str(exc)
    assert wrong not in str(exc) and API_KEY not in str(exc)


def test_forced_429_carries_retry_after(start_sim: StartSim, adapter_for: AdapterFactory) -> None:
    request = _request()
    sim = start_sim(fault_by_key={request.key: "429"})
    exc = _fails(adapter_for(sim), request)
    assert isinstance(exc, RetriableError) and exc.status == 429
    assert exc.retry_after == pytest.approx(1.0)
    assert exc.request_id and exc.request_id.startswith("req_")


def test_rate_limit_429_carries_the_precise_wait(
    start_sim: StartSim, adapter_for: AdapterFactory
) -> None:
    sim = start_sim(rpm=60)  # one request per second, bucket of one
    make = adapter_for(sim, adaptive=False, trust_limit_headers=False)
    _call(make, _request("p1"))
    exc = _fails(make, _request("p2"))
    assert isinstance(exc, RetriableError) and exc.status == 429
    assert exc.retry_after is not None and 0.0 < exc.retry_after <= 1.0


@pytest.mark.parametrize("fault", ["500", "503", "502", "reset"])
def test_server_errors_and_resets_are_retriable(
    fault: str, start_sim: StartSim, adapter_for: AdapterFactory
) -> None:
    request = _request()
    sim = start_sim(fault_by_key={request.key: fault})
    exc = _fails(adapter_for(sim), request)
    assert isinstance(exc, RetriableError)
    assert exc.status == (None if fault == "reset" else int(fault))
    if fault == "502":
        assert "non-JSON error body (text/html" in str(exc)


def test_400_is_transport_rejected(start_sim: StartSim, adapter_for: AdapterFactory) -> None:
    request = _request()
    sim = start_sim(fault_by_key={request.key: "400"})
    exc = _fails(adapter_for(sim), request)
    assert isinstance(exc, TransportRejected) and exc.status == 400
    assert str(exc).startswith("HTTP 400 invalid_request_error/invalid_value: ")


def test_total_timeout_bounds_a_hung_call(start_sim: StartSim) -> None:
    request = _request()
    sim = start_sim(fault_by_key={request.key: "timeout"}, hang_seconds=5.0)
    adapter = OpenAIHttpModel(
        base_url=sim.base_url,
        model=MODEL,
        limiter=EndpointLimiter(LimiterConfig()),
        timeouts=HttpTimeouts(connect=1.0, read=30.0, total=0.3),
    )
    started = time.monotonic()
    with pytest.raises(RetriableError, match="timeout"):
        _call(lambda: adapter, request)
    assert time.monotonic() - started < 2.0


def test_connection_refused_is_retriable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    adapter = OpenAIHttpModel(
        base_url=f"http://127.0.0.1:{port}/v1",
        model=MODEL,
        limiter=EndpointLimiter(LimiterConfig()),
        timeouts=HttpTimeouts(connect=1.0, read=60.0, total=2.0),
    )
    with pytest.raises(RetriableError, match="connection error"):
        _call(lambda: adapter, _request())


def test_a_deadline_plans_flex_quota_decides_each_keys_tier(
    start_sim: StartSim, adapter_for: AdapterFactory
) -> None:
    # The plan gave acme one flex key: the first key sent takes it (and keeps it when sent
    # again, as after a refusal), every other key goes at standard.
    sim = start_sim()
    make = adapter_for(sim, tier=Tier.FLEX)

    def planned() -> OpenAIHttpModel:
        adapter = make()
        adapter.flex_quota = quota
        return adapter

    quota = FlexQuota({"acme": 1, "globex": 0})
    first, second = _request("p1"), _request("p2")
    tiers = [_call(planned, r).service_tier for r in (first, second, first)]
    assert tiers == ["flex", "standard", "flex"]
    billed = sorted(c.service_tier or "" for c in sim.meter.snapshot().billed.values())
    assert billed == ["default", "flex", "flex"]
