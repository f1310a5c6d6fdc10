"""Hostile chat answers: over-billing, usage shapes, Retry-After forms, 5xx headers, echoes."""

from __future__ import annotations

import math
import time
from collections import Counter
from email.utils import parsedate_to_datetime

import httpx
import pytest

from backfill_assets.providers.models.rules import count_tokens
from backfill_assets.providersim import FaultRule

POST = "Limited offer!!! buy now at http://deals.example.xyz"


def _counted_prompt(body: dict) -> int:
    return sum(count_tokens(m["content"]) + 4 for m in body["messages"])


def test_prompt_token_factor_bills_more_in_usage_meter_and_tpm(
    start_sim, chat_body, key_for
) -> None:
    body = chat_body(key_for("over"), POST, max_tokens=1)
    counted = _counted_prompt(body)
    # A TPM bucket that holds two requests billed at 1x, but not two billed at 3x.
    tpm = 4 * counted * 60
    honest, greedy = start_sim(tpm=tpm), start_sim(tpm=tpm, prompt_token_factor=3)
    with httpx.Client(timeout=5) as client:
        fair = [client.post(f"{honest.base_url}/chat/completions", json=body) for _ in range(2)]
        over = [client.post(f"{greedy.base_url}/chat/completions", json=body) for _ in range(2)]

    assert [r.status_code for r in fair] == [200, 200]
    assert fair[0].json()["usage"]["prompt_tokens"] == counted
    assert [r.status_code for r in over] == [200, 429]
    usage = over[0].json()["usage"]
    assert usage["prompt_tokens"] == 3 * counted
    assert usage["total_tokens"] == 3 * counted + usage["completion_tokens"]
    assert f"Requested {3 * counted + 1}." in over[1].json()["error"]["message"]
    meter = greedy.meter.snapshot()
    assert meter.billed_prompt_tokens == 3 * counted
    assert meter.billed_tokens_total == usage["total_tokens"]


def test_fractional_factor_rounds_up(start_sim, chat_body, key_for) -> None:
    body = chat_body(key_for("frac"), POST)
    sim = start_sim(prompt_token_factor=1.1)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        usage = client.post("/chat/completions", json=body).json()["usage"]
    assert usage["prompt_tokens"] == math.ceil(_counted_prompt(body) * 1.1)
    assert usage["prompt_tokens"] > _counted_prompt(body)


SHAPES = {
    "full": lambda p, c: {
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": c // 4,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    },
    "details_null": lambda p, c: {
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    },
    "completion_null": lambda p, c: {
        "prompt_tokens": p,
        "completion_tokens": None,
        "total_tokens": p + c,
    },
    "total_only": lambda p, c: {"total_tokens": p + c},
    "plain": lambda p, c: {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
}


@pytest.mark.parametrize("shape", [*SHAPES, "none"])
def test_usage_shapes_change_what_is_shown_never_what_is_billed(
    start_sim, chat_body, key_for, shape
) -> None:
    key = key_for(f"shape-{shape}")
    body = chat_body(key, POST)
    sim = start_sim(usage_shape=shape, prompt_token_factor=3)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        data = client.post("/chat/completions", json=body).json()

    prompt = 3 * _counted_prompt(body)
    completion = count_tokens(data["choices"][0]["message"]["content"])
    if shape == "none":
        assert "usage" not in data
    else:
        assert data["usage"] == SHAPES[shape](prompt, completion)
    bill = sim.meter.snapshot().billed_by_correlation_id[key]
    assert (bill.requests, bill.prompt_tokens, bill.completion_tokens) == (1, prompt, completion)
    assert bill.total_tokens == prompt + completion


def test_usage_shape_mix_is_drawn_per_key_from_the_seed(start_sim, chat_body, key_for) -> None:
    mix = ("full", "completion_null", "total_only", "none")
    keys = [key_for(f"mix-{i}") for i in range(40)]

    def shapes_seen(seed: int, rounds: int) -> list[tuple[str, ...]]:
        sim = start_sim(usage_shape_mix=mix, seed=seed)
        seen = []
        with httpx.Client(base_url=sim.base_url, timeout=5) as client:
            for key in keys:
                answers = [client.post("/chat/completions", json=chat_body(key)).json()]
                answers += [
                    client.post("/chat/completions", json=chat_body(key)).json()
                    for _ in range(rounds - 1)
                ]
                seen.append(tuple(_shape_of(a) for a in answers))
        return seen

    first, again, other = shapes_seen(5, 2), shapes_seen(5, 1), shapes_seen(6, 1)
    assert all(len(set(row)) == 1 for row in first)  # every retry of a key sees one shape
    assert [row[0] for row in first] == [row[0] for row in again]
    assert [row[0] for row in first] != [row[0] for row in other]
    assert set(Counter(row[0] for row in first)) == set(mix)


def _shape_of(answer: dict) -> str:
    usage = answer.get("usage")
    if usage is None:
        return "none"
    if set(usage) == {"total_tokens"}:
        return "total_only"
    if usage["completion_tokens"] is None:
        return "completion_null"
    return "full" if usage.get("prompt_tokens_details") else "plain"


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ("both", {"retry-after": "1", "retry-after-ms": "1000"}),
        ("seconds", {"retry-after": "1"}),
        ("ms", {"retry-after-ms": "1000"}),
        ("huge", {"retry-after": "1000000000000"}),
        ("none", {}),
    ],
)
def test_retry_after_formats_on_a_forced_429(start_sim, chat_body, key_for, fmt, expected) -> None:
    key = key_for("429")
    sim = start_sim(fault_by_key={key: "429"}, retry_after_format=fmt)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = client.post("/chat/completions", json=chat_body(key))
    assert resp.status_code == 429
    hints = {k: v for k, v in resp.headers.items() if k.startswith("retry-after")}
    assert hints == expected


def test_retry_after_as_http_date_on_a_rate_limit(start_sim, chat_body, key_for) -> None:
    sim = start_sim(rpm=6, retry_after_format="http_date")  # bucket of 0.1: wait ~10 s
    body = chat_body(key_for("date"))
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        assert client.post("/chat/completions", json=body).status_code == 200
        limited = client.post("/chat/completions", json=body)
    asked = time.time()
    assert limited.status_code == 429
    assert "retry-after-ms" not in limited.headers
    header = limited.headers["retry-after"]
    assert header.endswith(" GMT") and not header.isdigit()
    wait = parsedate_to_datetime(header).timestamp() - asked
    assert 8.0 <= wait <= 11.5


@pytest.mark.parametrize("kind", ["500", "502", "503"])
def test_reset_headers_on_5xx_claim_exhausted_limits(start_sim, chat_body, key_for, kind) -> None:
    key = key_for(kind)
    sim = start_sim(rpm=600, fault_by_key={key: kind}, reset_headers_on_5xx=True)
    plain = start_sim(fault_by_key={key: kind})
    with httpx.Client(timeout=5) as client:
        resp = client.post(f"{sim.base_url}/chat/completions", json=chat_body(key))
        healthy = client.post(f"{sim.base_url}/chat/completions", json=chat_body(key_for("ok")))
        default = client.post(f"{plain.base_url}/chat/completions", json=chat_body(key))
    assert resp.status_code == int(kind)
    assert resp.headers["x-ratelimit-limit-requests"] == "600"
    assert resp.headers["x-ratelimit-remaining-requests"] == "0"
    assert resp.headers["x-ratelimit-reset-requests"] == "6m0s"
    assert resp.headers["x-ratelimit-remaining-tokens"] == "0"
    assert resp.headers["x-ratelimit-reset-tokens"] == "6m0s"
    # Only the 5xx lies; a 200 reports the real bucket.
    assert healthy.headers["x-ratelimit-remaining-requests"] != "0"
    assert not [h for h in default.headers if h.startswith("x-ratelimit-")]


def _errors(sim, chat_body, key_for) -> dict[str, tuple[str, httpx.Response]]:
    """Each kind of error: the user message sent and the answer."""
    kinds = pins_of(key_for).values()
    bodies = {kind: chat_body(key_for(kind), f"{POST} {kind}") for kind in kinds}
    bodies["invalid"] = chat_body(key_for("invalid"), f"{POST} invalid", temperature=7)
    bodies["unknown_model"] = chat_body(key_for("unknown"), f"{POST} unknown", model="gpt-nope")
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        return {
            name: (body["messages"][-1]["content"], client.post("/chat/completions", json=body))
            for name, body in bodies.items()
        }


def pins_of(key_for) -> dict[str, str]:
    return {key_for(kind): kind for kind in ("400", "429", "500", "503")}


def test_echo_errors_quote_the_user_message_verbatim(start_sim, chat_body, key_for) -> None:
    config = {"fault_by_key": pins_of(key_for), "strict_models": True}
    echoing = _errors(start_sim(echo_errors=True, **config), chat_body, key_for)
    quiet = _errors(start_sim(**config), chat_body, key_for)

    statuses = {name: resp.status_code for name, (_, resp) in echoing.items()}
    assert statuses == {
        "400": 400,
        "429": 429,
        "500": 500,
        "503": 503,
        "invalid": 400,
        "unknown_model": 404,
    }
    for name, (user, resp) in echoing.items():
        assert POST in user
        assert f"Invalid content: '{user}'" in resp.json()["error"]["message"], name
        assert POST not in quiet[name][1].text, name


def test_echo_errors_leave_auth_refusals_alone(start_sim, chat_body, key_for) -> None:
    sim = start_sim(echo_errors=True, api_key="sk-right-key-000000")
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = client.post("/chat/completions", json=chat_body(key_for("a"), POST))
    assert resp.status_code == 401
    assert POST not in resp.text


def test_random_refusal_faults_hit_a_share_of_attempts(start_sim, chat_body, key_for) -> None:
    sim = start_sim(seed=3, faults=[FaultRule(kind="401", rate=0.3)])
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        statuses = [
            client.post("/chat/completions", json=chat_body(key_for(f"r{i}"))).status_code
            for i in range(40)
        ]
    assert set(statuses) == {200, 401}
    meter = sim.meter.snapshot()
    assert meter.refusals_by_status == {401: statuses.count(401)}
    assert len(meter.billed) == statuses.count(200)
