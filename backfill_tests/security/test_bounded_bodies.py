"""No answer is read past its cap, however it is sent: a 50 MB body, a gzip bomb, a body that
never ends. Chat answers stop at 1 MiB (a transport error of that key); batch files stream to
disk and stop at ``BACKFILL_BATCH_MAX_OUTPUT_BYTES``; the process survives, memory stays flat.
"""

from __future__ import annotations

import asyncio
import io
import tracemalloc

import pytest

from backfill_assets.domain.policy.rubric import MAX_OUTPUT_TOKENS, Rubric
from backfill_assets.providers.batch_client import BatchClient, BatchEndpoint
from backfill_assets.providers.bounded_body import CHAT_MAX_BYTES, BodyTooLarge
from backfill_assets.providers.models.base import ModelRequest, TransportRejected
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.providers.models.timeouts import HttpTimeouts
from backfill_assets.providers.ratelimit import EndpointLimiter, LimiterConfig
from backfill_assets.providersim.bodies import BodyServer, BodyShape

RUBRIC = Rubric()
KEY = "c" * 64
SHAPES: list[BodyShape] = ["huge", "gzip", "endless"]


def _request() -> ModelRequest:
    return ModelRequest(
        key=KEY,
        tenant_id="acme",
        post_id="p1",
        attempt=1,
        model="gpt-4o-mini",
        messages=RUBRIC.messages(KEY, "a post"),
        max_output_tokens=MAX_OUTPUT_TOKENS,
        estimated_tokens=500,
        contract=RUBRIC.contract,
    )


def _peak_mib(coro_factory: object) -> tuple[object, float]:
    tracemalloc.start()
    try:
        got = asyncio.run(coro_factory())  # type: ignore[operator]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return got, peak / (1 << 20)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_chat_answer_past_its_cap_is_a_transport_error_of_that_key(shape: BodyShape) -> None:
    with BodyServer(shape, size=50 << 20) as url:

        async def call() -> object:
            adapter = OpenAIHttpModel(
                base_url=url,
                model="gpt-4o-mini",
                limiter=EndpointLimiter(LimiterConfig()),
                timeouts=HttpTimeouts(connect=2.0, read=20.0, total=20.0),
            )
            try:
                return await adapter.complete(_request())
            except TransportRejected as exc:
                return exc
            finally:
                await adapter.aclose()

        got, peak = _peak_mib(call)
    assert isinstance(got, TransportRejected), got
    assert f"answer body over {CHAT_MAX_BYTES:,} bytes" in str(got)
    assert peak < 16, f"{peak:.1f} MiB held for a {shape} body"


@pytest.mark.parametrize("shape", SHAPES)
def test_a_batch_file_past_its_cap_is_refused_and_never_held(shape: BodyShape) -> None:
    cap = 4 << 20
    with BodyServer(shape, size=40 << 20) as url:

        async def fetch() -> object:
            client = BatchClient(BatchEndpoint(url, "gpt-4o-mini"))
            out = io.BytesIO()
            try:
                return await client.content("file-1", out, cap)
            except BodyTooLarge as exc:
                return exc
            finally:
                await client.aclose()
                assert out.tell() <= cap

        got, peak = _peak_mib(fetch)
    assert isinstance(got, BodyTooLarge), got
    assert peak < 16 + cap / (1 << 20), f"{peak:.1f} MiB held for a {shape} file"


def test_a_file_within_its_cap_is_read_whole() -> None:
    with BodyServer("gzip", size=3 << 20) as url:

        async def fetch() -> int:
            client = BatchClient(BatchEndpoint(url, "gpt-4o-mini"))
            try:
                return await client.content("file-1", io.BytesIO(), 4 << 20)
            finally:
                await client.aclose()

        assert asyncio.run(fetch()) == 3 << 20
