"""The ``openai-moderation`` dialect's adapter against hostile answers of the endpoint.

MockTransport stands in for the provider's answers here (a wrong count, the wrong field, an
echo of the key, a 401); the whole path against the simulator is in ``cli/``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import httpx
import pytest

from backfill_assets.domain.policy.dialect_sections import MODERATION_CATEGORIES
from backfill_assets.domain.policy.file import parse_policy
from backfill_assets.domain.policy.rubric import MAX_OUTPUT_TOKENS, Rubric
from backfill_assets.providers.models.base import (
    ModelRequest,
    ModelResponse,
    RetriableError,
    RunFatalError,
    TransportRejected,
)
from backfill_assets.providers.models.openai_moderation import OpenAIModerationModel
from backfill_assets.providers.ratelimit import EndpointLimiter, LimiterConfig
from backfill_tests.domain.test_moderation_dialect import BASE, MAPPING

KEY = "b" * 64
POST = "Cornelius Vandermeer, I will hurt you"
API_KEY = "sk-mod-0123456789abcdef"
RUBRIC = Rubric(parse_policy(BASE + MAPPING), "openai-moderation")


def _request() -> ModelRequest:
    return ModelRequest(
        key=KEY,
        tenant_id="acme",
        post_id="p1",
        attempt=1,
        model="omni-moderation-latest",
        messages=RUBRIC.messages(KEY, POST),
        max_output_tokens=MAX_OUTPUT_TOKENS,
        estimated_tokens=40,
        contract=RUBRIC.contract,
    )


def _result(violence: float = 0.93) -> dict[str, Any]:
    scores = dict.fromkeys(MODERATION_CATEGORIES, 0.01)
    scores["violence"] = violence
    return {
        "flagged": violence >= 0.5,
        "categories": {c: s >= 0.5 for c, s in scores.items()},
        "category_scores": scores,
        "category_applied_input_types": {c: ["text"] for c in scores},
    }


def _call(reply: httpx.Response, seen: list[httpx.Request] | None = None) -> ModelResponse:
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return reply

    adapter = OpenAIModerationModel(
        base_url="http://provider.invalid/v1",
        model="omni-moderation-latest",
        limiter=EndpointLimiter(LimiterConfig()),
        api_key=API_KEY,
        transport=httpx.MockTransport(handler),
    )

    async def call() -> ModelResponse:
        try:
            return await adapter.complete(_request())
        finally:
            await adapter.aclose()

    return asyncio.run(call())


def test_one_post_is_sent_as_the_text_alone_and_its_result_comes_back_free() -> None:
    seen: list[httpx.Request] = []
    body = {"id": "modr-1", "model": "omni-moderation-latest", "results": [_result()]}
    got = _call(httpx.Response(200, json=body, headers={"x-request-id": "req_9"}), seen)
    [request] = seen
    assert request.method == "POST" and request.url.path == "/v1/moderations"
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    # The documented body: the model and an array of one input, the post unframed, no key.
    assert json.loads(request.content) == {"model": "omni-moderation-latest", "input": [POST]}
    assert KEY.encode() not in request.content
    assert json.loads(got.raw_text) == _result()
    assert (got.tokens_in, got.tokens_out, got.usage_shape, got.cost_nanos) == (0, 0, "none", 0)
    assert got.request_id == "req_9" and not got.cost_unknown and got.price_booked
    out = RUBRIC.parse(got.raw_text, KEY)
    assert (out.label, out.rule_ids, out.confidence) == ("threat", ("T1",), 0.93)


@pytest.mark.parametrize(
    "body",
    [
        b"<html>502 from a proxy</html>",
        json.dumps({"result": [_result()]}).encode(),
        json.dumps({"results": []}).encode(),
        json.dumps({"results": [_result(), _result()]}).encode(),
        json.dumps({"results": ["violence"]}).encode(),
        json.dumps([_result()]).encode(),
    ],
    ids=["not-json", "wrong-field", "no-result", "two-results", "not-an-object", "bare-array"],
)
def test_a_2xx_that_is_not_one_result_per_input_is_retried(body: bytes) -> None:
    with pytest.raises(RetriableError, match="HTTP 200"):
        _call(httpx.Response(200, content=body))


def test_scores_in_the_wrong_field_reach_the_gate_and_are_refused_there() -> None:
    hostile = _result()
    hostile["scores"] = hostile.pop("category_scores")
    got = _call(httpx.Response(200, json={"results": [hostile]}))
    with pytest.raises(Exception, match="no category_scores"):
        RUBRIC.parse(got.raw_text, KEY)


def test_refusals_keep_the_taxonomy_and_never_echo_the_key_or_post() -> None:
    echo = {"error": {"message": f"bad: {POST} ({API_KEY})", "type": "invalid_request_error"}}
    with pytest.raises(TransportRejected) as rejected:
        _call(httpx.Response(400, json=echo))
    assert "Cornelius" not in str(rejected.value) and API_KEY not in str(rejected.value)
    with pytest.raises(RunFatalError):
        _call(httpx.Response(401, json={"error": {"message": "Incorrect API key provided"}}))
    with pytest.raises(RetriableError) as limited:
        _call(
            httpx.Response(429, json={"error": {"message": "slow"}}, headers={"retry-after": "7"})
        )
    assert limited.value.retry_after == 7.0


def test_a_huge_answer_is_refused_without_being_read_whole() -> None:
    huge = (
        b'{"results": [{"category_scores": {"violence": 0.9, "pad": "' + b"x" * (3 << 20) + b'"}}]}'
    )
    with pytest.raises(TransportRejected, match="HTTP 200"):
        _call(httpx.Response(200, content=huge))


def _many(per_request: int, posts: list[tuple[str, str]]) -> tuple[list[Any], list[ModelResponse]]:
    """``posts`` (tenant, text) asked for at once; the bodies the provider got, the answers."""
    bodies: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        results = [_result(violence=0.9 if "hurt" in text else 0.01) for text in body["input"]]
        return httpx.Response(200, json={"results": results}, headers={"x-request-id": "req_m"})

    adapter = OpenAIModerationModel(
        base_url="http://provider.invalid/v1",
        model="omni-moderation-latest",
        limiter=EndpointLimiter(LimiterConfig()),
        transport=httpx.MockTransport(handler),
        inputs_per_request=per_request,
    )

    def ask(tenant: str, i: int, text: str) -> ModelRequest:
        return dataclasses.replace(
            _request(),
            key=f"{i:064x}",
            tenant_id=tenant,
            post_id=f"p{i}",
            messages=RUBRIC.messages(f"{i:064x}", text),
        )

    async def call() -> list[ModelResponse]:
        try:
            return await asyncio.gather(
                *(adapter.complete(ask(t, i, text)) for i, (t, text) in enumerate(posts))
            )
        finally:
            await adapter.aclose()

    return bodies, asyncio.run(call())


def test_posts_of_one_tenant_asked_together_share_a_request_and_keep_their_own_results() -> None:
    posts = [("acme", f"post {i}") for i in range(5)] + [("acme", "I will hurt you")]
    posts += [("globex", "globex post"), ("globex", "hurt globex")]
    bodies, answers = _many(32, posts)
    # One request per tenant: a request never carries two tenants' posts.
    assert sorted(len(b["input"]) for b in bodies) == [2, 6]
    for body in bodies:
        tenants = {t for t, text in posts if text in body["input"]}
        assert len(tenants) == 1
    # Each post gets its own result, in its place.
    for (_t, text), got in zip(posts, answers, strict=True):
        score = json.loads(got.raw_text)["category_scores"]["violence"]
        assert score == (0.9 if "hurt" in text else 0.01)
        assert got.request_id == "req_m" and got.tokens_in == 0


def test_a_request_carries_at_most_its_limit() -> None:
    bodies, answers = _many(2, [("acme", f"post {i}") for i in range(5)])
    assert sorted(len(b["input"]) for b in bodies) == [1, 2, 2] and len(answers) == 5
    bodies, _answers = _many(1, [("acme", f"post {i}") for i in range(3)])
    assert [len(b["input"]) for b in bodies] == [1, 1, 1]
