"""Rate limits over real HTTP: 429s with retry hints, nothing consumed, and recovery."""

from __future__ import annotations

import time

import httpx
import pytest

from backfill_assets.providers.models.rules import count_tokens


def _post(client: httpx.Client, body: dict) -> httpx.Response:
    return client.post("/chat/completions", json=body)


def test_rpm_limit_answers_429_with_retry_after_then_recovers(
    start_sim, chat_body, key_for
) -> None:
    sim = start_sim(rpm=120)  # 2 requests/s, bucket of 2
    body = chat_body(key_for("rpm"))
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        first, second, limited = (_post(client, body) for _ in range(3))
        assert (first.status_code, second.status_code) == (200, 200)
        assert limited.status_code == 429
        error = limited.json()["error"]
        assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
        assert limited.headers["retry-after"] == "1"
        wait_ms = int(limited.headers["retry-after-ms"])
        assert 400 <= wait_ms <= 500
        assert limited.headers["x-ratelimit-remaining-requests"] == "0"
        assert limited.headers["x-ratelimit-limit-requests"] == "120"

        time.sleep(wait_ms / 1000)
        assert _post(client, body).status_code == 200

    snap = sim.meter.snapshot()
    # The 429 neither consumed capacity nor counted as an attempt of the key.
    assert snap.calls_by_correlation_id == {key_for("rpm"): 3}
    assert len(snap.timestamps) == 3
    assert snap.responses_by_status == {200: 3, 429: 1}


def test_tpm_limit_charges_prompt_plus_max_tokens(start_sim, chat_body, key_for) -> None:
    sim = start_sim(tpm=60_000)  # 1000 tokens/s, bucket of 1000
    body = chat_body(key_for("tpm"), max_tokens=100)
    charge = sum(count_tokens(m["content"]) + 4 for m in body["messages"]) + 100
    fits = 1000 // charge
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        answers = [_post(client, body) for _ in range(fits + 1)]
        assert [a.status_code for a in answers] == [200] * fits + [429]
        limited = answers[-1]
        assert limited.json()["error"]["type"] == "tokens"
        remaining = int(limited.headers["x-ratelimit-remaining-tokens"])
        # What the 200s left, plus whatever refilled (1 token/ms) while they ran.
        assert 1000 - fits * charge <= remaining < charge
        wait_ms = int(limited.headers["retry-after-ms"])
        assert wait_ms == pytest.approx(charge - remaining, abs=5)

        time.sleep(wait_ms / 1000)
        assert _post(client, body).status_code == 200


def test_request_larger_than_the_bucket_is_admitted_once_then_throttled(
    start_sim, chat_body, key_for
) -> None:
    sim = start_sim(tpm=6_000)  # 100 tokens/s, smaller than one request
    body = chat_body(key_for("big"), max_tokens=64)
    charge = sum(count_tokens(m["content"]) + 4 for m in body["messages"]) + 64
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        first, second = _post(client, body), _post(client, body)
    assert first.status_code == 200
    assert second.status_code == 429
    # Back to a full bucket of 100 from a debt of (charge - 100), at 100 tokens/s.
    assert int(second.headers["retry-after-ms"]) == pytest.approx(charge * 10, rel=0.02)


def test_admitted_rate_respects_rpm_for_a_client_that_honours_retry_after(
    start_sim, chat_body, key_for
) -> None:
    sim = start_sim(rpm=1200)  # 20/s, bucket of 20
    total = 40
    started = time.monotonic()
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        done = 0
        while done < total:
            resp = _post(client, chat_body(key_for(str(done))))
            if resp.status_code == 429:
                time.sleep(int(resp.headers["retry-after-ms"]) / 1000)
                continue
            assert resp.status_code == 200
            done += 1
    elapsed = time.monotonic() - started
    stamps = sim.meter.snapshot().timestamps
    assert len(stamps) == total
    # The first 20 ride the burst; the other 20 need a second of refill.
    assert elapsed >= 0.95
    assert (total - 20) / (stamps[-1] - stamps[0]) <= 21.0


def test_unlimited_config_sends_no_rate_limit_headers(start_sim, chat_body, key_for) -> None:
    sim = start_sim()
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = _post(client, chat_body(key_for("free")))
    assert resp.status_code == 200
    assert not [h for h in resp.headers if h.startswith("x-ratelimit-")]
