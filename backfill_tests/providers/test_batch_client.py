"""The Files/Batches client: failure classes, back-off, and finding a lost create by metadata."""

from __future__ import annotations

import asyncio
import io
import json
from datetime import UTC, datetime

import httpx
import pytest

from backfill_assets.domain.work.outcomes import RetryPolicy
from backfill_assets.providers.batch_client import (
    BatchClient,
    BatchEndpoint,
    RateLimited,
    Refused,
    TokenLimited,
    Unsure,
    retry,
)
from backfill_assets.providers.models.base import RunFatalError
from backfill_tests.dispatch.batch.conftest import API_KEY, StartSim


def _client(handler: httpx.MockTransport) -> BatchClient:
    endpoint = BatchEndpoint("http://provider.test/v1", "gpt-4o-mini", api_key=API_KEY)
    return BatchClient(endpoint, transport=handler, retry_base_s=0.001)


def _error(status: int, code: str, message: str = "nope") -> httpx.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    return httpx.Response(status, json=body, headers={"retry-after-ms": "20"})


def test_failures_are_classified_and_never_carry_the_key() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == f"Bearer {API_KEY}"
        path = request.url.path
        if path.endswith("/slow"):
            raise httpx.ReadTimeout("slow", request=request)
        if path.endswith("/busy"):
            return _error(429, "rate_limit_exceeded")
        if path.endswith("/down"):
            return httpx.Response(502, text="<html>bad gateway</html>")
        return _error(400, "token_limit_exceeded", f"key {API_KEY} over the limit")

    async def scenario() -> list[Exception]:
        client = _client(httpx.MockTransport(handler))
        found: list[Exception] = []
        for batch_id in ("slow", "busy", "down", "full"):
            with pytest.raises((Unsure, RateLimited, Refused)) as info:
                await client.retrieve(batch_id)
            found.append(info.value)
        await client.aclose()
        return found

    slow, busy, down, full = asyncio.run(scenario())
    assert isinstance(slow, Unsure) and isinstance(down, Unsure) and down.status == 502
    assert isinstance(busy, RateLimited) and busy.retry_after == pytest.approx(0.02)
    assert isinstance(full, TokenLimited) and full.code == "token_limit_exceeded"
    assert all(API_KEY not in str(e) for e in (slow, busy, down, full))


def test_every_call_uses_the_one_error_taxonomy() -> None:
    """401/403/404 and account codes stop the run on every endpoint; a bogus Retry-After is
    bounded; an upload refused with the file's text quoted back does not carry it."""
    post = "my unmistakable post text, quoted back"
    answers = {
        "POST /v1/files": _error(400, "invalid_file", f"line 1 has {post} in it"),
        "POST /v1/batches": _error(403, "unsupported_country_region_territory"),
        "GET /v1/batches/b1": _error(401, "invalid_api_key", f"Incorrect API key {API_KEY}"),
        "GET /v1/batches": _error(429, "insufficient_quota", "You exceeded your quota"),
        "GET /v1/batches/b2": httpx.Response(429, headers={"retry-after": "1000000000000"}),
    }

    def handler(request: httpx.Request) -> httpx.Response:
        return answers[f"{request.method} {request.url.path}"]

    async def scenario() -> list[Exception]:
        client = BatchClient(
            BatchEndpoint("http://provider.test/v1", "gpt-4o-mini", api_key=API_KEY),
            transport=httpx.MockTransport(handler),
        )
        calls = [
            client.upload("c.jsonl", b"{}", echoes=[post]),
            client.create("file-1", {}),
            client.retrieve("b1"),
            client.page(None),
            client.retrieve("b2"),
        ]
        found: list[Exception] = []
        for call in calls:
            try:
                await call
            except Exception as exc:  # collected and checked below
                found.append(exc)
        await client.aclose()
        return found

    upload, create, status, listing, bogus = asyncio.run(scenario())
    assert isinstance(upload, Refused) and post not in str(upload) and "withheld" in str(upload)
    for exc, status_code, where in (
        (create, 403, "POST http://provider.test/v1/batches"),
        (status, 401, "GET http://provider.test/v1/batches/b1"),
        (listing, 429, "GET http://provider.test/v1/batches"),
    ):
        assert isinstance(exc, RunFatalError), exc
        assert exc.status == status_code and exc.endpoint == where
        assert str(status_code) in str(exc) and where in str(exc) and API_KEY not in str(exc)
    assert isinstance(bogus, RateLimited) and bogus.retry_after == 900.0


def test_retry_waits_out_429s_and_gives_up_after_its_attempts() -> None:
    calls: list[str] = []

    async def flaky() -> str:
        calls.append("x")
        if len(calls) < 3:
            raise RateLimited("429", retry_after=0.01)
        return "ok"

    async def never() -> str:
        calls.append("down")
        raise Unsure("down")

    quick = RetryPolicy(
        max_attempts=8,
        retry_base_seconds=0.001,
        retry_max_seconds=30.0,
        retry_after_max_seconds=900.0,
    )
    assert asyncio.run(retry(flaky, what="t", policy=quick)) == "ok" and len(calls) == 3
    calls.clear()
    with pytest.raises(Unsure):
        asyncio.run(
            retry(
                never,
                what="t",
                policy=RetryPolicy(
                    max_attempts=3,
                    retry_base_seconds=0.001,
                    retry_max_seconds=30.0,
                    retry_after_max_seconds=900.0,
                ),
            )
        )
    assert len(calls) == 3


def test_find_pages_newest_first_and_stops_at_batches_older_than_the_intent() -> None:
    now = int(datetime.now(UTC).timestamp())
    batches = [
        {
            "id": f"b{i}",
            "status": "completed",
            "created_at": now - 60 * i,
            "metadata": {"chunk_id": f"c{i}"},
        }
        for i in range(12)
    ]
    pages: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        after = request.url.params.get("after")
        pages.append(after)
        start = 0 if after is None else int(after[1:]) + 1
        data = batches[start : start + 3]
        return httpx.Response(
            200, json={"data": data, "has_more": start + 3 < 12, "last_id": data[-1]["id"]}
        )

    async def find(chunk: str, minutes_ago: int) -> str | None:
        client = _client(httpx.MockTransport(handler))
        since = datetime.fromtimestamp(now - 60 * minutes_ago, UTC).replace(tzinfo=None)
        found = await client.find("chunk_id", chunk, since)
        await client.aclose()
        return found.id if found else None

    assert asyncio.run(find("c4", 30)) == "b4"
    assert pages == [None, "b2"]
    pages.clear()
    # Intent 2 minutes ago (+5 minutes of skew): pages older than that are not read.
    assert asyncio.run(find("c11", 2)) is None
    assert pages == [None, "b2", "b5"]


def test_client_against_the_simulator(start_sim: StartSim) -> None:
    sim = start_sim()
    content = json.dumps(
        {
            "custom_id": "k1",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
        }
    ).encode()

    async def scenario() -> tuple[str, str | None, bytes]:
        client = BatchClient(BatchEndpoint(sim.base_url, "gpt-4o-mini", api_key=API_KEY))
        file_id = await client.upload("c.jsonl", content + b"\n")
        created = await client.create(file_id, {"chunk_id": "ck-1"})
        batch = created
        while not batch.terminal:
            await asyncio.sleep(0.005)
            batch = await client.retrieve(created.id)
        since = datetime.now(UTC).replace(tzinfo=None)
        found = await client.find("chunk_id", "ck-1", since)
        out = io.BytesIO()
        await client.content(batch.output_file_id or "", out, 1 << 20)
        output = out.getvalue()
        # 404 is run-level in the one taxonomy (unknown model, wrong URL): the run stops.
        with pytest.raises(RunFatalError) as info:
            await client.create("file-missing", {})
        assert info.value.status == 404 and "POST" in info.value.endpoint
        await client.aclose()
        return batch.status, found.id if found else None, output

    status, found, output = asyncio.run(scenario())
    assert status == "completed" and found is not None
    assert json.loads(output)["custom_id"] == "k1"
