"""Every fault kind over real HTTP, and reproducible fault sequences."""

from __future__ import annotations

import json

import httpx
import pytest

from backfill_assets.domain.policy.output_gate import OutputRejected, parse_output
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.providersim import FaultRule


@pytest.mark.parametrize(
    ("kind", "status", "error_type"),
    [
        ("500", 500, "server_error"),
        ("503", 503, "server_error"),
        ("400", 400, "invalid_request_error"),
        ("429", 429, "requests"),
    ],
)
def test_status_faults_answer_an_openai_error_and_bill_nothing(
    start_sim, chat_body, key_for, kind, status, error_type
) -> None:
    key = key_for(kind)
    sim = start_sim(fault_by_key={key: kind})
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = client.post("/chat/completions", json=chat_body(key))
        healthy = client.post("/chat/completions", json=chat_body(key_for("healthy")))
    assert resp.status_code == status
    assert resp.json()["error"]["type"] == error_type
    assert resp.headers["x-request-id"].startswith("req_")
    if kind == "429":
        assert resp.headers["retry-after"] == "1"
        assert resp.headers["retry-after-ms"] == "1000"
        assert resp.json()["error"]["code"] == "rate_limit_exceeded"
    assert healthy.status_code == 200
    assert [c.correlation_id for c in sim.meter.snapshot().billed.values()] == [key_for("healthy")]


def test_502_is_an_html_page_like_a_proxy_sends(start_sim, chat_body, key_for) -> None:
    key = key_for("502")
    sim = start_sim(fault_by_key={key: "502"})
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = client.post("/chat/completions", json=chat_body(key))
    assert resp.status_code == 502
    assert resp.headers["content-type"] == "text/html"
    assert "502 Bad Gateway" in resp.text
    assert sim.meter.snapshot().billed == {}


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("malformed", "malformed JSON"),
        ("unknown_label", "label"),
        ("bad_confidence", "confidence"),
        ("wrong_key", "correlation id does not match"),
    ],
)
def test_content_faults_are_billed_200s_that_fail_the_contract(
    start_sim, chat_body, key_for, kind, reason
) -> None:
    key = key_for(kind)
    sim = start_sim(fault_by_key={key: kind})
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = client.post("/chat/completions", json=chat_body(key))
    assert resp.status_code == 200
    data = resp.json()
    with pytest.raises(OutputRejected, match=reason):
        parse_output(data["choices"][0]["message"]["content"], key, Rubric().contract)
    billed = sim.meter.snapshot().billed[resp.headers["x-request-id"]]
    assert billed.correlation_id == key
    assert billed.completion_tokens == data["usage"]["completion_tokens"]


def test_content_fault_values_are_the_documented_ones(start_sim, chat_body, key_for) -> None:
    pins = {key_for(k): k for k in ("unknown_label", "bad_confidence", "wrong_key")}
    sim = start_sim(fault_by_key=pins)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        answers = {
            kind: json.loads(
                client.post("/chat/completions", json=chat_body(key)).json()["choices"][0][
                    "message"
                ]["content"]
            )
            for key, kind in pins.items()
        }
    assert answers["unknown_label"]["label"] == "maybe"
    assert answers["bad_confidence"]["confidence"] == 1.7
    wrong = answers["wrong_key"]["correlation_id"]
    assert wrong != key_for("wrong_key")
    assert len(wrong) == 64


def test_reset_drops_the_connection_without_a_response(start_sim, chat_body, key_for) -> None:
    key = key_for("reset")
    sim = start_sim(fault_by_key={key: "reset"})
    with (
        httpx.Client(base_url=sim.base_url, timeout=5) as client,
        pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)),
    ):
        client.post("/chat/completions", json=chat_body(key))
    snap = sim.meter.snapshot()
    assert snap.dropped == {"reset": 1}
    assert snap.billed == {}
    assert snap.responses_by_status == {}


def test_timeout_fault_hangs_until_the_client_gives_up(start_sim, chat_body, key_for) -> None:
    key = key_for("timeout")
    sim = start_sim(fault_by_key={key: "timeout"}, hang_seconds=0.6)
    with (
        httpx.Client(base_url=sim.base_url, timeout=0.2) as client,
        pytest.raises(httpx.ReadTimeout),
    ):
        client.post("/chat/completions", json=chat_body(key))
    snap = sim.meter.snapshot()
    assert snap.billed == {}
    assert snap.calls_by_correlation_id == {key: 1}


def test_stop_ends_requests_that_are_still_hanging(start_sim, chat_body, key_for) -> None:
    key = key_for("hang")
    sim = start_sim(fault_by_key={key: "timeout"}, hang_seconds=60)
    with (
        httpx.Client(base_url=sim.base_url, timeout=0.2) as client,
        pytest.raises(httpx.ReadTimeout),
    ):
        client.post("/chat/completions", json=chat_body(key))
    sim.stop()  # must return promptly despite the 60 s hang


def _statuses(sim, chat_body, keys: list[str], attempts: int) -> list[list[int]]:
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        return [
            [
                client.post("/chat/completions", json=chat_body(k)).status_code
                for _ in range(attempts)
            ]
            for k in keys
        ]


def test_non_sticky_faults_replay_with_the_seed_and_let_retries_succeed(
    start_sim, chat_body, key_for
) -> None:
    keys = [key_for(f"post-{i}") for i in range(12)]
    rules = [FaultRule(kind="503", rate=0.5)]
    first = _statuses(start_sim(seed=7, faults=rules), chat_body, keys, 4)
    again = _statuses(start_sim(seed=7, faults=rules), chat_body, keys, 4)
    other = _statuses(start_sim(seed=8, faults=rules), chat_body, keys, 4)

    assert first == again
    assert first != other
    assert any(503 in row and 200 in row for row in first), "a retry should be able to succeed"
    assert {s for row in first for s in row} == {200, 503}


def test_sticky_faults_fail_every_attempt_of_a_key_alike(start_sim, chat_body, key_for) -> None:
    keys = [key_for(f"post-{i}") for i in range(12)]
    sim = start_sim(seed=7, faults=[FaultRule(kind="500", rate=0.5, sticky=True)])
    rows = _statuses(sim, chat_body, keys, 4)
    assert all(len(set(row)) == 1 for row in rows)
    assert {row[0] for row in rows} == {200, 500}
    assert sim.meter.snapshot().calls_by_correlation_id == dict.fromkeys(keys, 4)


def test_first_matching_rule_wins(start_sim, chat_body, key_for) -> None:
    sim = start_sim(
        faults=[FaultRule(kind="unknown_label", rate=1.0), FaultRule(kind="500", rate=1.0)]
    )
    rows = _statuses(sim, chat_body, [key_for("a"), key_for("b")], 2)
    assert rows == [[200, 200], [200, 200]]
