"""The simulator over real HTTP: OpenAI response shape, validation, auth and admin routes."""

from __future__ import annotations

import json
import re
import socket

import httpx

from backfill_assets.domain.policy.file import builtin_policy
from backfill_assets.domain.policy.output_gate import OutputContract
from backfill_assets.providers.models.rules import count_tokens, judge
from backfill_assets.providersim import MeterSnapshot

POST_TEXT = "Limited offer!!! buy now at http://deals.example.xyz"


def test_ok_answer_has_the_openai_shape_and_echoes_the_key(start_sim, chat_body, key_for) -> None:
    sim = start_sim(rpm=600, tpm=100_000)
    key = key_for("ok-shape")
    body = chat_body(key, POST_TEXT)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = client.post("/chat/completions", json=body)

    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/json"
    assert re.fullmatch(r"req_[0-9a-f]{32}", resp.headers["x-request-id"])
    assert resp.headers["x-ratelimit-limit-requests"] == "600"
    assert resp.headers["x-ratelimit-remaining-requests"] == "9"
    assert resp.headers["x-ratelimit-limit-tokens"] == "100000"
    assert re.fullmatch(r"\d+(ms|(\.\d+)?s)", resp.headers["x-ratelimit-reset-tokens"])
    data = resp.json()
    assert set(data) >= {"id", "object", "created", "model", "choices", "usage"}
    assert re.fullmatch(r"chatcmpl-[0-9a-f]+", data["id"])
    assert (data["object"], data["model"]) == ("chat.completion", "gpt-4o-mini")
    assert isinstance(data["created"], int)
    [choice] = data["choices"]
    assert (choice["index"], choice["finish_reason"]) == (0, "stop")
    assert choice["message"]["role"] == "assistant"
    label, _rules, confidence = judge(POST_TEXT, OutputContract.of(builtin_policy()))
    assert label == "spam"
    assert json.loads(choice["message"]["content"]) == {
        "schema_version": 1,
        "correlation_id": key,
        "label": label,
        "rule_ids": [],
        "confidence": confidence,
    }
    prompt = sum(count_tokens(m["content"]) + 4 for m in body["messages"])
    completion = count_tokens(choice["message"]["content"])
    assert data["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def test_bad_bodies_get_400_with_openai_error_body(start_sim, chat_body, key_for) -> None:
    sim = start_sim()
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        no_model = chat_body(key_for("x"))
        del no_model["model"]
        bad_messages = chat_body(key_for("x"), messages="hello")
        not_json = client.post(
            "/chat/completions", content=b"{oops", headers={"content-type": "application/json"}
        )
        answers = [client.post("/chat/completions", json=b) for b in (no_model, bad_messages)]

    for resp, param in zip([not_json, *answers], [None, "model", "messages"], strict=True):
        assert resp.status_code == 400
        error = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error"
        assert error["param"] == param
    assert sim.meter.snapshot().billed == {}


def test_api_key_is_required_when_configured(start_sim, chat_body, key_for) -> None:
    sim = start_sim(api_key="sk-test-123")
    body = chat_body(key_for("auth"))
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        missing = client.post("/chat/completions", json=body)
        wrong = client.post(
            "/chat/completions", json=body, headers={"authorization": "Bearer sk-nope"}
        )
        right = client.post(
            "/chat/completions", json=body, headers={"authorization": "Bearer sk-test-123"}
        )
        models = client.get("/models")

    for resp in (missing, wrong, models):
        assert resp.status_code == 401
        error = resp.json()["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
    assert right.status_code == 200
    assert sim.meter.snapshot().responses_by_status == {401: 2, 200: 1}


def test_models_list_and_unknown_routes(start_sim) -> None:
    sim = start_sim(models=("m-small", "m-large"))
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        models = client.get("/models").json()
        unknown = client.post("/images/generations", json={})
        wrong_method = client.get("/chat/completions")

    assert models["object"] == "list"
    assert [(m["id"], m["object"]) for m in models["data"]] == [
        ("m-small", "model"),
        ("m-large", "model"),
    ]
    assert unknown.status_code == 404
    assert unknown.json()["error"]["message"] == "Invalid URL (POST /v1/images/generations)"
    assert wrong_method.status_code == 405


def test_admin_meter_route_mirrors_the_snapshot_and_reset_clears_it(
    start_sim, chat_body, key_for
) -> None:
    sim = start_sim()
    admin = sim.base_url.removesuffix("/v1")
    with httpx.Client(timeout=5) as client:
        for name in ("a", "b", "a"):
            client.post(f"{sim.base_url}/chat/completions", json=chat_body(key_for(name)))
        served = MeterSnapshot.from_dict(client.get(f"{admin}/_sim/meter").json())
        assert served == sim.meter.snapshot()
        assert served.calls_by_correlation_id == {key_for("a"): 2, key_for("b"): 1}
        assert len(served.billed) == 3

        assert client.post(f"{admin}/_sim/reset").status_code == 200
        cleared = client.get(f"{admin}/_sim/meter").json()

    assert cleared["requests_total"] == 0
    assert cleared["billed"] == []
    assert cleared["calls_by_correlation_id"] == {}


def test_keep_alive_serves_many_requests_on_one_connection(start_sim, chat_body, key_for) -> None:
    sim = start_sim()
    # One connection allowed: every request after the first must reuse it.
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    with httpx.Client(base_url=sim.base_url, timeout=5, limits=limits) as client:
        statuses = [
            client.post("/chat/completions", json=chat_body(key_for(str(i)))).status_code
            for i in range(20)
        ]
    assert statuses == [200] * 20


def test_garbage_on_the_wire_gets_a_400_not_a_crash(start_sim) -> None:
    sim = start_sim()
    with socket.create_connection(("127.0.0.1", sim.port), timeout=5) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 400")


def test_oversized_body_gets_413(start_sim, chat_body, key_for) -> None:
    sim = start_sim(max_body_bytes=2000)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = client.post("/chat/completions", json=chat_body(key_for("big"), "x" * 5000))
    assert resp.status_code == 413
