"""Billing and load: exactly the 200s with usage are billed; hundreds of concurrent calls."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest


def test_meter_bills_exactly_the_200s_with_usage(start_sim, chat_body, key_for) -> None:
    pins = {
        key_for("500"): "500",
        key_for("forced-429"): "429",
        key_for("reset"): "reset",
        key_for("malformed"): "malformed",
        key_for("wrong_key"): "wrong_key",
    }
    sim = start_sim(fault_by_key=pins)
    usages: dict[str, int] = {}
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        for key in [key_for("ok-1"), key_for("ok-2"), *pins]:
            try:
                resp = client.post("/chat/completions", json=chat_body(key, f"post {key[:6]}"))
            except httpx.TransportError:
                continue
            if resp.status_code == 200:
                usages[resp.headers["x-request-id"]] = resp.json()["usage"]["total_tokens"]
        assert client.post("/chat/completions", json={"model": "m"}).status_code == 400

    snap = sim.meter.snapshot()
    assert snap.requests_total == 8
    assert snap.responses_by_status == {200: 4, 500: 1, 429: 1, 400: 1}
    assert snap.dropped == {"reset": 1}
    assert set(snap.billed) == set(usages)
    assert snap.billed_tokens_total == sum(usages.values())
    assert snap.billed_prompt_tokens + snap.billed_completion_tokens == snap.billed_tokens_total
    assert {c.correlation_id for c in snap.billed.values()} == {
        key_for("ok-1"),
        key_for("ok-2"),
        key_for("malformed"),
        key_for("wrong_key"),
    }


def test_reset_method_clears_meter_and_restarts_fault_draws(start_sim, chat_body, key_for) -> None:
    sim = start_sim(rpm=60)  # one request per second
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        assert client.post("/chat/completions", json=chat_body(key_for("a"))).status_code == 200
        assert client.post("/chat/completions", json=chat_body(key_for("a"))).status_code == 429
        sim.reset()
        assert sim.meter.snapshot().requests_total == 0
        # Refilled buckets: no second of waiting needed.
        assert client.post("/chat/completions", json=chat_body(key_for("a"))).status_code == 200
    assert sim.meter.snapshot().calls_by_correlation_id == {key_for("a"): 1}


def test_two_hundred_concurrent_calls_with_latency(start_sim, chat_body, key_for) -> None:
    sim = start_sim(latency_median_ms=150, latency_sigma=0.5, seed=3)
    n = 200

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        async with httpx.AsyncClient(base_url=sim.base_url, timeout=10, limits=limits) as client:
            return await asyncio.gather(
                *(
                    client.post("/chat/completions", json=chat_body(key_for(f"load-{i}")))
                    for i in range(n)
                )
            )

    started = time.monotonic()
    answers = asyncio.run(run())
    elapsed = time.monotonic() - started

    assert [a.status_code for a in answers] == [200] * n
    served_seconds = sum(int(a.headers["openai-processing-ms"]) for a in answers) / 1000
    # About 34 s of simulated latency in all; it only fits in the wall time if calls overlap.
    assert served_seconds > 20
    assert elapsed < served_seconds / 3
    snap = sim.meter.snapshot()
    assert (snap.requests_total, len(snap.billed)) == (n, n)
    assert snap.billed_tokens_total == sum(a.json()["usage"]["total_tokens"] for a in answers)


@pytest.mark.parametrize("median_ms", [80.0])
def test_latency_is_applied(start_sim, chat_body, key_for, median_ms) -> None:
    sim = start_sim(latency_median_ms=median_ms)  # sigma 0: exactly the median
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        started = time.monotonic()
        resp = client.post("/chat/completions", json=chat_body(key_for("slow")))
        elapsed_ms = (time.monotonic() - started) * 1000
    assert resp.status_code == 200
    assert elapsed_ms >= median_ms
