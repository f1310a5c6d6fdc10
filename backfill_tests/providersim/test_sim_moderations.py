"""``POST /v1/moderations`` over real HTTP: wire shapes, scores, limits, faults and the meter."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from backfill_assets.providers.models.rules import count_tokens
from backfill_assets.providersim import FaultRule, MeterSnapshot, SimConfig, Simulator
from backfill_tests.providersim.batchkit import FAST, create, file_lines, jsonl, upload, wait

CATEGORIES = {
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
}
VIOLENT = "I will kill you tomorrow"
HARMLESS = "The weather is lovely and the tea is warm."
INSULT = "you are such an idiot, stupid"
HATEFUL = "I hate them all"
SPAM = "Limited offer!!! buy now, click here: http://deals.example.xyz"


def _key(text: str) -> str:
    """The correlation id (and pin key) of a text: its sha256 hex."""
    return hashlib.sha256(text.encode()).hexdigest()


def _moderate(client: httpx.Client, payload: Any, **extra: Any) -> httpx.Response:
    body = payload if isinstance(payload, dict) else {"input": payload}
    return client.post("/moderations", json={"model": "omni-moderation-latest", **body}, **extra)


def _ok(client: httpx.Client, payload: Any) -> dict[str, Any]:
    resp = _moderate(client, payload)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def _meter_json(sim: Simulator) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(sim.base_url.removesuffix("/v1") + "/_sim/meter").json()
    return data


# --- Wire shapes ---------------------------------------------------------------------------


def test_the_three_input_shapes_answer_alike(start_sim) -> None:
    sim = start_sim()
    texts = [VIOLENT, HARMLESS]
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        single = _ok(client, VIOLENT)
        strings = _ok(client, texts)
        parts = _ok(client, [{"type": "text", "text": t} for t in texts])

    assert len(single["results"]) == 1
    assert len(strings["results"]) == len(parts["results"]) == 2
    assert single["results"][0] == strings["results"][0] == parts["results"][0]
    assert strings["results"][1] == parts["results"][1]


def test_one_result_per_input_in_input_order(start_sim) -> None:
    sim = start_sim()
    texts = [HARMLESS, VIOLENT, INSULT, HATEFUL, SPAM, HARMLESS]
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        results = _ok(client, texts)["results"]

    assert [r["flagged"] for r in results] == [False, True, True, True, False, False]
    flagged = [{c for c, on in r["categories"].items() if on} for r in results]
    assert flagged[0] == flagged[4] == flagged[5] == set()
    assert {"violence", "harassment/threatening"} <= flagged[1]
    assert flagged[2] == {"harassment"}
    assert flagged[3] == {"hate"}
    assert results[0] == results[5]


def test_answer_has_openais_shape_with_all_13_categories_and_no_usage(start_sim) -> None:
    sim = start_sim()
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = client.post("/moderations", json={"input": INSULT})  # no model: the default
        data = resp.json()

    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/json"
    assert resp.headers["x-request-id"].startswith("req_")
    assert set(data) == {"id", "model", "results"}  # free: no usage
    assert data["id"].startswith("modr-")
    assert len(data["id"]) == len("modr-") + 32
    assert data["model"] == "omni-moderation-latest"
    [result] = data["results"]
    assert set(result) == {
        "flagged",
        "categories",
        "category_scores",
        "category_applied_input_types",
    }
    for field in ("categories", "category_scores", "category_applied_input_types"):
        assert set(result[field]) == CATEGORIES, field
    assert all(isinstance(v, bool) for v in result["categories"].values())
    scores = result["category_scores"]
    assert all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in scores.values())
    assert all(v == ["text"] for v in result["category_applied_input_types"].values())
    # A category is on exactly when its score reaches 0.5; flagged when any is on.
    assert result["categories"] == {c: s >= 0.5 for c, s in scores.items()}
    assert result["flagged"] is any(result["categories"].values())


def test_model_is_echoed_and_listed(start_sim) -> None:
    sim = start_sim()
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        data = _ok(client, {"model": "text-moderation-latest", "input": HARMLESS})
        listed = {m["id"] for m in client.get("/models").json()["data"]}
    assert data["model"] == "text-moderation-latest"
    assert {"omni-moderation-latest", "text-moderation-latest"} <= listed


# --- Scores --------------------------------------------------------------------------------


def test_scores_are_deterministic_across_requests_and_simulators(start_sim) -> None:
    first, second = start_sim(seed=1), start_sim(seed=2)
    texts = [VIOLENT, HARMLESS, INSULT]
    with httpx.Client(timeout=5) as client:
        a = client.post(f"{first.base_url}/moderations", json={"input": texts}).json()
        b = client.post(f"{first.base_url}/moderations", json={"input": texts}).json()
        c = client.post(f"{second.base_url}/moderations", json={"input": texts}).json()
    assert a["results"] == b["results"] == c["results"]
    assert a["id"] != b["id"]
    # The jitter depends on the text: two harmless texts do not score the same.
    assert a["results"][1]["category_scores"] != a["results"][2]["category_scores"]


def test_keywords_drive_their_categories(start_sim) -> None:
    expected = {
        "they will kill him": "violence",
        "this could hurt": "violence",
        "what an idiot": "harassment",
        "that is stupid": "harassment",
        "I hate this group": "hate",
        "where to buy drugs": "illicit",
        "I want to kill myself": "self-harm/intent",
    }
    sim = start_sim()
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        results = _ok(client, list(expected))["results"]
    for (text, category), result in zip(expected.items(), results, strict=True):
        assert result["categories"][category] is True, text
        assert result["category_scores"][category] >= 0.5, text


def test_harmless_text_and_spam_score_low_everywhere(start_sim) -> None:
    sim = start_sim()
    texts = [HARMLESS, SPAM, "", "skills and stability", "Click here to buy now!"]
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        results = _ok(client, texts)["results"]
    for text, result in zip(texts, results, strict=True):
        assert result["flagged"] is False, text
        assert max(result["category_scores"].values()) < 0.05, text


def test_pinned_scores_replace_the_computed_ones_for_that_text_only(start_sim) -> None:
    pinned = "an ordinary sentence"
    sim = start_sim(
        moderation_scores={
            _key(pinned): {"sexual/minors": 0.97, "hate": 0.5},
            _key(VIOLENT): {"violence": 0.0, "harassment/threatening": 0.49, "harassment": 0.2},
        }
    )
    plain = start_sim()
    with httpx.Client(timeout=5) as client:
        texts = [pinned, VIOLENT, HARMLESS]
        got = client.post(f"{sim.base_url}/moderations", json={"input": texts}).json()["results"]
        raw = client.post(f"{plain.base_url}/moderations", json={"input": texts}).json()["results"]

    scores = got[0]["category_scores"]
    assert (scores["sexual/minors"], scores["hate"]) == (0.97, 0.5)
    assert {c for c, on in got[0]["categories"].items() if on} == {"sexual/minors", "hate"}
    assert got[0]["flagged"] is True
    # Categories not pinned keep their computed scores.
    unpinned = CATEGORIES - {"sexual/minors", "hate"}
    assert {c: scores[c] for c in unpinned} == {c: raw[0]["category_scores"][c] for c in unpinned}
    violent = got[1]
    assert violent["category_scores"]["violence"] == 0.0
    assert violent["categories"]["violence"] is False
    assert violent["categories"]["harassment/threatening"] is False  # 0.49: below the cut
    assert violent["flagged"] is False  # nothing else reaches 0.5 in this text
    assert got[2] == raw[2]


@pytest.mark.parametrize(
    ("pins", "message"),
    [
        ({"I will kill you": {"violence": 0.9}}, "sha256 hex"),
        ({_key("x"): {"spam": 0.9}}, "unknown moderation category"),
        ({_key("x"): {"violence": 1.5}}, "within"),
        ({_key("x"): {"violence": float("nan")}}, "within"),
    ],
)
def test_pins_that_could_never_apply_are_refused(pins, message) -> None:
    with pytest.raises(ValidationError, match=message):
        SimConfig(moderation_scores=pins)


# --- Refusals, bad bodies and limits -------------------------------------------------------


def test_api_key_is_required(start_sim) -> None:
    sim = start_sim(api_key="sk-test-123")
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        missing = _moderate(client, HARMLESS)
        wrong = _moderate(client, HARMLESS, headers={"authorization": "Bearer sk-nope"})
        right = _moderate(client, HARMLESS, headers={"authorization": "Bearer sk-test-123"})

    for resp in (missing, wrong):
        assert resp.status_code == 401
        assert resp.json()["error"]["code"] == "invalid_api_key"
    assert right.status_code == 200
    snap = sim.meter.snapshot()
    assert snap.refusals_by_endpoint == {"POST /v1/moderations": 2}
    assert len(snap.billed) == 1


def test_forbid_answers_403(start_sim) -> None:
    sim = start_sim(forbid="region")
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = _moderate(client, HARMLESS)
    assert resp.status_code == 403
    assert resp.json()["error"]["code"] == "unsupported_country_region_territory"


def test_strict_models_answer_404_for_an_unknown_model(start_sim) -> None:
    sim = start_sim(strict_models=True)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        unknown = _moderate(client, {"model": "moderation-9000", "input": HARMLESS})
        known = _moderate(client, {"model": "text-moderation-latest", "input": HARMLESS})
        default = client.post("/moderations", json={"input": HARMLESS})

    assert unknown.status_code == 404
    error = unknown.json()["error"]
    assert error["code"] == "model_not_found"
    assert "`moderation-9000`" in error["message"]
    assert (known.status_code, default.status_code) == (200, 200)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"not json {", None),
        (b"[1, 2]", None),
        (b'{"model": "omni-moderation-latest"}', "input"),
        (b'{"input": 42}', "input"),
        (b'{"input": []}', "input"),
        (b'{"input": "hi", "model": 7}', "model"),
        (b'{"input": ["a", {"type": "text", "text": "b"}]}', "input[0]"),
        (b'{"input": [{"type": "text", "text": 5}]}', "input[0].text"),
        (b'{"input": [{"type": "audio", "text": "x"}]}', "input[0].type"),
        (
            b'{"input": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}',
            "input[0]",
        ),
    ],
)
def test_bad_bodies_answer_400_in_openais_error_shape(start_sim, body, param) -> None:
    sim = start_sim()
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = client.post(
            "/moderations", content=body, headers={"content-type": "application/json"}
        )
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    snap = sim.meter.snapshot()
    assert snap.billed == {}
    assert snap.timestamps == ()  # consumed no capacity


def test_echo_errors_quote_the_first_input(start_sim) -> None:
    sim = start_sim(echo_errors=True)
    secret = "call me at +1 555 0100"
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = _moderate(client, {"input": [{"type": "text", "text": secret}, {"type": "x"}]})
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].endswith(f"Invalid content: '{secret}'")


def test_rpm_limit_answers_429_with_retry_after_and_counts_one_request(start_sim) -> None:
    sim = start_sim(rpm=60)  # one request a second, bucket of one
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        first = _moderate(client, [HARMLESS, VIOLENT, INSULT])  # three inputs, one request
        limited = _moderate(client, HARMLESS)
        chat = client.post(
            "/chat/completions",
            json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
        )

    assert first.status_code == 200
    assert limited.status_code == 429
    error = limited.json()["error"]
    assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
    assert "omni-moderation-latest" in error["message"]
    assert limited.headers["retry-after"] == "1"
    assert 900 <= int(limited.headers["retry-after-ms"]) <= 1000
    assert limited.headers["x-ratelimit-remaining-requests"] == "0"
    assert chat.status_code == 429  # the buckets are shared with chat
    snap = sim.meter.snapshot()
    assert len(snap.timestamps) == 1
    assert snap.calls_by_correlation_id == {_key(HARMLESS): 1}  # the 429 was no attempt


def test_tpm_limit_charges_the_inputs_tokens(start_sim) -> None:
    sim = start_sim(tpm=60_000)  # 1000 tokens a second, bucket of 1000
    texts = ["word " * 80, "more " * 240]  # 100 + 300 tokens
    charge = sum(count_tokens(t) for t in texts)
    assert charge == 400
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        answers = [_moderate(client, texts) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    error = answers[-1].json()["error"]
    assert error["type"] == "tokens"
    assert f"Requested {charge}." in error["message"]


def test_latency_applies(start_sim) -> None:
    sim = start_sim(latency_median_ms=150)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        started = time.monotonic()
        assert _moderate(client, HARMLESS).status_code == 200
    assert time.monotonic() - started >= 0.14


# --- Faults --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "status", "code"),
    [
        ("500", 500, None),
        ("503", 503, None),
        ("400", 400, "invalid_value"),
        ("429", 429, "rate_limit_exceeded"),
        ("401", 401, "invalid_api_key"),
        ("403", 403, "unsupported_country_region_territory"),
        ("404", 404, "model_not_found"),
    ],
)
def test_status_faults_answer_json_errors_and_bill_nothing(start_sim, kind, status, code) -> None:
    text = f"post that fails with {kind}"
    sim = start_sim(fault_by_key={_key(text): kind})
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = _moderate(client, [text, HARMLESS])
        healthy = _moderate(client, [HARMLESS, text])  # the key is the first input's

    assert resp.status_code == status
    assert resp.json()["error"]["code"] == code
    if kind == "429":
        assert (resp.headers["retry-after"], resp.headers["retry-after-ms"]) == ("1", "1000")
    if kind == "404":
        assert "`omni-moderation-latest`" in resp.json()["error"]["message"]
    assert healthy.status_code == 200
    billed = list(sim.meter.snapshot().billed.values())
    assert [c.correlation_id for c in billed] == [_key(HARMLESS)]


def test_502_fault_is_a_proxys_html_page(start_sim) -> None:
    sim = start_sim(fault_by_key={_key(VIOLENT): "502"})
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = _moderate(client, VIOLENT)
    assert resp.status_code == 502
    assert resp.headers["content-type"] == "text/html"
    assert "502 Bad Gateway" in resp.text
    assert sim.meter.snapshot().billed == {}


def test_reset_fault_drops_the_connection(start_sim) -> None:
    sim = start_sim(fault_by_key={_key(VIOLENT): "reset"})
    with (
        httpx.Client(base_url=sim.base_url, timeout=5) as client,
        pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)),
    ):
        _moderate(client, VIOLENT)
    snap = sim.meter.snapshot()
    assert (snap.dropped, snap.billed, snap.responses_by_status) == ({"reset": 1}, {}, {})


def test_timeout_fault_hangs_until_the_client_gives_up(start_sim) -> None:
    sim = start_sim(fault_by_key={_key(VIOLENT): "timeout"}, hang_seconds=0.6)
    with (
        httpx.Client(base_url=sim.base_url, timeout=0.2) as client,
        pytest.raises(httpx.ReadTimeout),
    ):
        _moderate(client, VIOLENT)
    snap = sim.meter.snapshot()
    assert snap.billed == {}
    assert snap.calls_by_correlation_id == {_key(VIOLENT): 1}


def test_malformed_fault_is_a_billed_200_whose_body_is_not_json(start_sim) -> None:
    sim = start_sim(fault_by_key={_key(VIOLENT): "malformed"})
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = _moderate(client, [VIOLENT, HARMLESS])
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/json"
    assert resp.text.startswith('{"id": "modr-')
    with pytest.raises(json.JSONDecodeError):
        json.loads(resp.content)
    assert len(sim.meter.snapshot().billed) == 1


def test_wrong_key_fault_answers_one_result_fewer_than_inputs(start_sim) -> None:
    sim = start_sim(fault_by_key={_key(VIOLENT): "wrong_key", _key(INSULT): "wrong_key"})
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        three = _ok(client, [VIOLENT, HARMLESS, HATEFUL])
        one = _ok(client, INSULT)
    assert len(three["results"]) == 2
    assert one["results"] == []
    assert len(sim.meter.snapshot().billed) == 2


def test_unknown_label_fault_moves_the_scores_to_a_wrong_field(start_sim) -> None:
    sim = start_sim(fault_by_key={_key(VIOLENT): "unknown_label"})
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        results = _ok(client, [VIOLENT, HARMLESS])["results"]
    assert len(results) == 2
    for result in results:
        assert "category_scores" not in result
        assert set(result["scores"]) == CATEGORIES


def test_bad_confidence_fault_reports_a_score_outside_0_1(start_sim) -> None:
    sim = start_sim(fault_by_key={_key(HARMLESS): "bad_confidence"})
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        results = _ok(client, [HARMLESS, INSULT])["results"]
    assert results[0]["category_scores"]["violence"] == 1.7
    assert all(0.0 <= s <= 1.0 for s in results[1]["category_scores"].values())


def test_fault_rules_draw_per_first_input_and_attempt(start_sim) -> None:
    sim = start_sim(faults=(FaultRule(kind="500", rate=1.0, sticky=True),))
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        statuses = [_moderate(client, HARMLESS).status_code for _ in range(3)]
    assert statuses == [500, 500, 500]
    assert sim.meter.snapshot().calls_by_correlation_id == {_key(HARMLESS): 3}


# --- Meter ---------------------------------------------------------------------------------


def test_meter_bills_one_free_call_per_answered_request(start_sim) -> None:
    sim = start_sim(fault_by_key={_key(VIOLENT): "500", _key(INSULT): "malformed"})
    chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        ok = [_moderate(client, [HARMLESS, HATEFUL]), _moderate(client, HATEFUL)]
        failed = _moderate(client, VIOLENT)
        malformed = _moderate(client, INSULT)
        completion = client.post("/chat/completions", json=chat)
        bad = client.post("/moderations", content=b"{")

    assert [r.status_code for r in ok] == [200, 200]
    assert (failed.status_code, malformed.status_code, bad.status_code) == (500, 200, 400)
    assert completion.status_code == 200
    snap = sim.meter.snapshot()
    moderation_ids = {r.headers["x-request-id"] for r in [*ok, malformed]}
    moderated = {rid: c for rid, c in snap.billed.items() if c.endpoint == "/v1/moderations"}
    assert set(moderated) == moderation_ids
    assert {c.correlation_id for c in moderated.values()} == {
        _key(HARMLESS),
        _key(HATEFUL),
        _key(INSULT),
    }
    for call in moderated.values():
        assert (call.prompt_tokens, call.completion_tokens, call.cost_nanos) == (0, 0, 0)
        assert call.model == "omni-moderation-latest"
        assert call.batch_id == ""
    chat_call = snap.billed[completion.headers["x-request-id"]]
    assert chat_call.endpoint == "/v1/chat/completions"
    assert chat_call.cost_nanos > 0
    # Totals: the chat call alone carries tokens and cost.
    assert snap.billed_cost_nanos == chat_call.cost_nanos
    assert snap.billed_tokens_total == chat_call.total_tokens
    by_endpoint = snap.billed_by_endpoint
    assert (by_endpoint["/v1/moderations"].calls, by_endpoint["/v1/moderations"].cost_nanos) == (
        3,
        0,
    )
    assert by_endpoint["/v1/chat/completions"].calls == 1
    assert snap.requests_total == 6
    assert snap.requests_by_endpoint == {"/v1/moderations": 5, "/v1/chat/completions": 1}
    assert snap.responses_by_status == {200: 4, 500: 1, 400: 1}


def test_meter_json_keeps_chat_items_and_marks_moderation_items(start_sim) -> None:
    sim = start_sim()
    chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        assert client.post("/chat/completions", json=chat).status_code == 200
        assert _moderate(client, HARMLESS).status_code == 200
        start = int(time.time()) - 86_400
        usage = client.get(f"/organization/usage/completions?start_time={start}").json()
        costs = client.get(f"/organization/costs?start_time={start}").json()

    served = _meter_json(sim)
    chat_item, moderation_item = served["billed"]
    assert set(chat_item) == {
        "request_id",
        "correlation_id",
        "model",
        "prompt_tokens",
        "completion_tokens",
        "batch_id",
        "cached_tokens",
        "service_tier",
        "cost_nanos",
        "billed_at",
    }
    assert set(moderation_item) == {*chat_item, "endpoint"}
    assert moderation_item["endpoint"] == "/v1/moderations"
    assert (moderation_item["prompt_tokens"], moderation_item["cost_nanos"]) == (0, 0)
    assert served["billed_by_endpoint"] == {
        "/v1/chat/completions": {"calls": 1, "cost_nanos": chat_item["cost_nanos"]},
        "/v1/moderations": {"calls": 1, "cost_nanos": 0},
    }
    assert served["requests_by_endpoint"] == {
        "/v1/chat/completions": 1,
        "/v1/moderations": 1,
    }
    assert MeterSnapshot.from_dict(served) == sim.meter.snapshot()
    # The organization's completions usage and costs know nothing of moderations.
    results = [r for bucket in usage["data"] for r in bucket["results"]]
    assert [(r["model"], r["num_model_requests"]) for r in results] == [("gpt-4o-mini", 1)]
    assert sum(len(bucket["results"]) for bucket in costs["data"]) == 1


def test_a_meter_json_without_endpoints_still_reads_as_chat_calls(start_sim) -> None:
    sim = start_sim()
    chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        assert client.post("/chat/completions", json=chat).status_code == 200
    served = _meter_json(sim)
    del served["billed_by_endpoint"], served["requests_by_endpoint"]  # an older simulator
    [call] = MeterSnapshot.from_dict(served).billed.values()
    assert call.endpoint == "/v1/chat/completions"


# --- Batch lines ---------------------------------------------------------------------------


def _moderation_lines(inputs: dict[str, Any], model: str | None = None) -> list[dict[str, Any]]:
    """One ``/v1/moderations`` batch line per custom id."""
    extra = {} if model is None else {"model": model}
    return [
        {
            "custom_id": cid,
            "method": "POST",
            "url": "/v1/moderations",
            "body": {"input": i, **extra},
        }
        for cid, i in inputs.items()
    ]


def _run_batch(client: httpx.Client, items: list[dict[str, Any]]) -> dict[str, Any]:
    file_id = upload(client, jsonl(items)).json()["id"]
    created = create(client, file_id, endpoint="/v1/moderations")
    assert created.status_code == 200, created.text
    batch, _ = wait(client, created.json())
    return batch


def test_batch_lines_answer_the_synchronous_shape_and_bill_zero(start_sim) -> None:
    sim = start_sim(**FAST)
    inputs = {"a": VIOLENT, "b": [HARMLESS, INSULT], "c": [{"type": "text", "text": HATEFUL}]}
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        batch = _run_batch(client, _moderation_lines(inputs))
        output = file_lines(client, batch["output_file_id"])
        sync = {cid: _ok(client, i)["results"] for cid, i in inputs.items()}

    assert batch["status"] == "completed"
    assert batch["endpoint"] == "/v1/moderations"
    assert batch["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert set(output) == set(inputs)
    for cid, line in output.items():
        response = line["response"]
        assert response["status_code"] == 200 and line["error"] is None
        body = response["body"]
        assert set(body) == {"id", "model", "results"}
        assert body["id"].startswith("modr-")
        assert body["model"] == "omni-moderation-latest"
        assert body["results"] == sync[cid]
    assert [r["flagged"] for r in output["b"]["response"]["body"]["results"]] == [False, True]
    snap = sim.meter.snapshot()
    in_batch = [c for c in snap.billed.values() if c.batch_id]
    assert len(in_batch) == 3
    for call in in_batch:
        assert call.batch_id == batch["id"]
        assert (call.endpoint, call.service_tier) == ("/v1/moderations", "batch")
        assert (call.prompt_tokens, call.completion_tokens, call.cost_nanos) == (0, 0, 0)
    assert {c.correlation_id for c in in_batch} == {_key(VIOLENT), _key(HARMLESS), _key(HATEFUL)}
    assert snap.billed_by_endpoint["/v1/moderations"].calls == 6  # 3 in the batch, 3 sync


def test_batch_line_faults_follow_the_plan(start_sim) -> None:
    pins = {
        _key(VIOLENT): "500",
        _key(INSULT): "malformed",
        _key(HATEFUL): "wrong_key",
        _key(SPAM): "bad_confidence",
    }
    sim = start_sim(fault_by_key=pins, moderation_scores={_key(HARMLESS): {"sexual": 0.9}}, **FAST)
    inputs = {"v": VIOLENT, "i": INSULT, "h": [HATEFUL, HARMLESS], "s": SPAM, "ok": HARMLESS}
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        batch = _run_batch(client, _moderation_lines(inputs))
        output = file_lines(client, batch["output_file_id"])
        errors = file_lines(client, batch["error_file_id"])

    assert set(errors) == {"v"}
    assert errors["v"]["response"]["status_code"] == 500
    malformed = output["i"]["response"]["body"]
    assert isinstance(malformed, str) and malformed.startswith('{"id": "modr-')
    with pytest.raises(json.JSONDecodeError):
        json.loads(malformed)
    assert len(output["h"]["response"]["body"]["results"]) == 1
    assert output["s"]["response"]["body"]["results"][0]["category_scores"]["violence"] == 1.7
    [pinned] = output["ok"]["response"]["body"]["results"]
    assert pinned["category_scores"]["sexual"] == 0.9 and pinned["flagged"] is True
    assert len([c for c in sim.meter.snapshot().billed.values() if c.batch_id]) == 4


def test_batch_validation_uses_moderation_rules(start_sim) -> None:
    sim = start_sim(strict_models=True, **FAST)
    image = [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        refused = _run_batch(client, _moderation_lines({"a": HARMLESS, "b": image}))
        content = jsonl(_moderation_lines({"a": HARMLESS}, model="moderation-9000"))
        file_id = upload(client, content).json()["id"]
        unknown = create(client, file_id, endpoint="/v1/moderations")
        chat_lines = jsonl(
            [{"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {}}]
        )
        mismatch = _run_batch(client, [json.loads(chat_lines)])

    assert refused["status"] == "failed"
    [error] = refused["errors"]["data"]
    assert (error["line"], error["param"]) == (2, "input[0]")
    assert unknown.status_code == 404
    assert mismatch["status"] == "failed"
    assert mismatch["errors"]["data"][0]["code"] == "mismatched_endpoint"


def test_batch_lines_without_a_model_name_the_default_to_strict_models(start_sim) -> None:
    sim = start_sim(strict_models=True, models=("gpt-4o-mini",), **FAST)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        file_id = upload(client, jsonl(_moderation_lines({"a": HARMLESS}))).json()["id"]
        resp = create(client, file_id, endpoint="/v1/moderations")
    assert resp.status_code == 404
    assert "`omni-moderation-latest`" in resp.json()["error"]["message"]
