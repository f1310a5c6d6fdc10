"""A hostile Batch API: refused and hung creates, lagging list, usage shapes, echoes."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from backfill_assets.providers.models.rules import count_tokens
from backfill_assets.providersim import MeterSnapshot, Simulator
from backfill_tests.providersim.batchkit import (
    FAST,
    create,
    file_lines,
    jsonl,
    request_lines,
    submit,
    upload,
    wait,
)

POST = "Limited offer!!! buy now at http://deals.example.xyz"


def _counted_prompt(body: dict[str, Any]) -> int:
    return sum(count_tokens(m["content"]) + 4 for m in body["messages"])


def test_first_creates_are_refused_400_token_limit_exceeded(
    start_sim: Callable[..., Simulator], chat_body, key_for
) -> None:
    sim = start_sim(batch_create_token_limit_count=2, **FAST)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        file_id = upload(client, jsonl(request_lines(chat_body, [key_for("t")]))).json()["id"]
        answers = [create(client, file_id, metadata={"chunk_id": "c"}) for _ in range(3)]
        listed = client.get("/batches").json()["data"]

    assert [a.status_code for a in answers] == [400, 400, 200]
    assert answers[0].json() == {
        "error": {
            "message": "Enqueued token limit reached for gpt-4o-mini in organization "
            "org-providersim. Please try again once some in_progress batches have been "
            "completed.",
            "type": "invalid_request_error",
            "param": None,
            "code": "token_limit_exceeded",
        }
    }
    assert [b["id"] for b in listed] == [answers[2].json()["id"]]
    meter = sim.meter.snapshot()
    assert (meter.batch_create_requests, meter.batch_creates_total) == (3, 1)
    assert meter.batch_creates_by_chunk == {"c": 1}


def test_a_created_batch_can_fail_with_token_limit_exceeded_when_overbilled(
    start_sim: Callable[..., Simulator], chat_body, key_for
) -> None:
    items = request_lines(chat_body, [key_for(f"o{i}") for i in range(5)])
    counted = sum(_counted_prompt(item["body"]) for item in items)
    # The limit holds the batch as counted, but not as billed at 3x.
    config = {"enqueued_token_limit": 2 * counted, **FAST}
    fair, greedy = start_sim(**config), start_sim(prompt_token_factor=3, **config)
    with httpx.Client(timeout=5) as client:
        client.base_url = httpx.URL(fair.base_url + "/")
        ok, _ = wait(client, submit(client, items))
        client.base_url = httpx.URL(greedy.base_url + "/")
        failed, seen = wait(client, submit(client, items))

    assert ok["status"] == "completed"
    assert seen == ["validating", "failed"]
    [error] = failed["errors"]["data"]
    assert error["code"] == "token_limit_exceeded" and error["line"] is None
    assert greedy.meter.snapshot().billed == {}


def test_list_lags_behind_creates_but_retrieve_does_not(
    start_sim: Callable[..., Simulator], chat_body, key_for
) -> None:
    sim = start_sim(batch_list_lag_ms=400, **{**FAST, "batch_processing_ms": 5000})
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        older = submit(client, request_lines(chat_body, [key_for("a")]), "a")
        time.sleep(0.45)
        newer = submit(client, request_lines(chat_body, [key_for("b")]), "b")
        at_once = [b["id"] for b in client.get("/batches").json()["data"]]
        after_hidden = client.get("/batches", params={"after": newer["id"]}).json()
        retrieved = client.get(f"/batches/{newer['id']}")
        time.sleep(0.45)
        later = [b["id"] for b in client.get("/batches").json()["data"]]
    assert at_once == [older["id"]]
    assert [b["id"] for b in after_hidden["data"]] == [older["id"]]
    assert retrieved.status_code == 200 and retrieved.json()["id"] == newer["id"]
    assert later == [newer["id"], older["id"]]


def test_a_hung_create_makes_a_batch_the_client_never_hears_of(
    start_sim: Callable[..., Simulator], chat_body, key_for
) -> None:
    sim = start_sim(batch_create_hang_count=1, hang_seconds=0.6, batch_list_lag_ms=300, **FAST)
    items = request_lines(chat_body, [key_for(f"h{i}") for i in range(3)])
    with httpx.Client(base_url=sim.base_url, timeout=0.2) as client:
        file_id = upload(client, jsonl(items)).json()["id"]
        with pytest.raises(httpx.ReadTimeout):
            create(client, file_id, metadata={"chunk_id": "c7"})
        # The naive check a client makes before creating again sees nothing yet.
        assert client.get("/batches").json()["data"] == []
        time.sleep(0.3)
        [found] = client.get("/batches").json()["data"]
        again = create(client, file_id, metadata={"chunk_id": "c8"})
        hung, _ = wait(client, found)

    assert found["metadata"] == {"chunk_id": "c7"}
    assert again.status_code == 200  # only the first create hangs
    assert hung["status"] == "completed" and hung["request_counts"]["completed"] == 3
    meter = sim.meter.snapshot()
    assert meter.batch_creates_by_chunk == {"c7": 1, "c8": 1}
    assert meter.batch_create_requests == 2
    assert {c.batch_id for c in meter.billed.values()} >= {hung["id"]}


def test_a_hung_create_closes_the_connection_after_hang_seconds(
    start_sim: Callable[..., Simulator], chat_body, key_for
) -> None:
    sim = start_sim(batch_create_hang_count=1, hang_seconds=0.1, **FAST)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        file_id = upload(client, jsonl(request_lines(chat_body, [key_for("x")]))).json()["id"]
        with pytest.raises(httpx.RemoteProtocolError):
            create(client, file_id)
    meter = sim.meter.snapshot()
    assert meter.dropped == {"batch_create": 1} and meter.batch_creates_total == 1


@pytest.mark.parametrize(
    "shape", ["plain", "full", "details_null", "completion_null", "total_only", "none"]
)
def test_batch_usage_shapes_and_overbilling_in_output_lines(
    start_sim: Callable[..., Simulator], chat_body, key_for, shape
) -> None:
    keys = [key_for(f"{shape}{i}") for i in range(3)]
    items = request_lines(chat_body, keys)
    sim = start_sim(batch_usage_shape=shape, prompt_token_factor=3, **FAST)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        batch, _ = wait(client, submit(client, items))
        output = file_lines(client, batch["output_file_id"])

    bills = sim.meter.snapshot().billed_by_correlation_id
    for item in items:
        body = output[item["custom_id"]]["response"]["body"]
        prompt = 3 * _counted_prompt(item["body"])
        completion = count_tokens(body["choices"][0]["message"]["content"])
        usage = body.get("usage")
        if shape == "none":
            assert "usage" not in body
        elif shape == "total_only":
            assert usage == {"total_tokens": prompt + completion}
        else:
            assert usage["prompt_tokens"] == prompt
            assert usage["total_tokens"] == prompt + completion
            want = None if shape == "completion_null" else completion
            assert usage["completion_tokens"] == want
            assert ("prompt_tokens_details" in usage) == (shape in ("full", "details_null"))
        bill = bills[item["custom_id"]]
        assert (bill.requests, bill.prompt_tokens, bill.completion_tokens) == (
            1,
            prompt,
            completion,
        )


def _user_of(item: dict[str, Any]) -> str:
    content: str = item["body"]["messages"][-1]["content"]
    return content


def test_echo_errors_in_error_lines_and_batch_errors(
    start_sim: Callable[..., Simulator], chat_body, key_for
) -> None:
    keys = [key_for(f"e{i}") for i in range(4)]
    items = [
        {**item, "body": chat_body(item["custom_id"], f"{POST} {n}")}
        for n, item in enumerate(request_lines(chat_body, keys))
    ]
    pins = {keys[0]: "400", keys[1]: "500"}
    # Slow enough that a cancel right after the create finds no line run yet.
    config = {"fault_by_key": pins, **FAST, "batch_processing_ms": 300}
    sim = start_sim(echo_errors=True, **config)
    limited = start_sim(echo_errors=True, enqueued_token_limit=1, **config)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        batch, _ = wait(client, submit(client, items))
        errors = file_lines(client, batch["error_file_id"])
        slow = submit(client, items[2:], "slow")
        time.sleep(0.02)  # past validation (a batch cancelled then has no lines at all)
        cancelled, _ = wait(client, client.post(f"/batches/{slow['id']}/cancel").json())
        unfinished = file_lines(client, cancelled["error_file_id"])
        dup_id = upload(client, jsonl([items[0], items[0]])).json()["id"]
        duplicate, _ = wait(client, create(client, dup_id).json())
        raw_id = upload(client, b"{not json " + POST.encode() + b"\n").json()["id"]
        not_json, _ = wait(client, create(client, raw_id).json())
    with httpx.Client(base_url=limited.base_url, timeout=5) as client:
        over_limit, _ = wait(client, submit(client, items))

    for n in (0, 1):
        message = errors[keys[n]]["response"]["body"]["error"]["message"]
        assert f"Invalid content: '{_user_of(items[n])}'" in message
    assert cancelled["status"] == "cancelled" and set(unfinished) == set(keys[2:])
    for key, line in unfinished.items():
        assert f"'{_user_of(items[keys.index(key)])}'" in line["error"]["message"]
    dup_error = next(e for e in duplicate["errors"]["data"] if e["code"] == "duplicate_custom_id")
    assert f"'{_user_of(items[0])}'" in dup_error["message"]
    [raw_error] = not_json["errors"]["data"]
    assert POST in raw_error["message"]
    [limit_error] = over_limit["errors"]["data"]
    assert limit_error["code"] == "token_limit_exceeded"
    assert f"'{_user_of(items[0])}'" in limit_error["message"]


def test_batch_errors_quote_nothing_by_default(
    start_sim: Callable[..., Simulator], chat_body, key_for
) -> None:
    keys = [key_for(f"q{i}") for i in range(2)]
    items = [{**i, "body": chat_body(i["custom_id"], POST)} for i in request_lines(chat_body, keys)]
    sim = start_sim(fault_by_key={keys[0]: "400"}, **FAST)
    limited = start_sim(enqueued_token_limit=1, **FAST)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        batch, _ = wait(client, submit(client, items))
        errors = client.get(f"/files/{batch['error_file_id']}/content").text
        raw_id = upload(client, b"{not json " + POST.encode() + b"\n").json()["id"]
        not_json, _ = wait(client, create(client, raw_id).json())
    with httpx.Client(base_url=limited.base_url, timeout=5) as client:
        failed, _ = wait(client, submit(client, items))
    assert '"status_code": 400' in errors and POST not in errors
    assert failed["errors"]["data"][0]["code"] == "token_limit_exceeded"
    assert POST not in json.dumps(failed) and POST not in json.dumps(not_json)


def test_meter_sums_per_key_across_sync_and_batch(
    start_sim: Callable[..., Simulator], chat_body, key_for
) -> None:
    key, other = key_for("both"), key_for("other")
    sim = start_sim(prompt_token_factor=2, **FAST)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        sync = [client.post("/chat/completions", json=chat_body(key)).json() for _ in range(2)]
        batch, _ = wait(client, submit(client, request_lines(chat_body, [key, other])))
        output = file_lines(client, batch["output_file_id"])
        admin = sim.base_url.removesuffix("/v1")
        served = client.get(f"{admin}/_sim/meter").json()

    usages = [a["usage"] for a in sync] + [output[key]["response"]["body"]["usage"]]
    snap = MeterSnapshot.from_dict(served)
    assert snap == sim.meter.snapshot()
    bill = snap.billed_by_correlation_id[key]
    assert bill.requests == 3
    assert bill.prompt_tokens == sum(u["prompt_tokens"] for u in usages)
    assert bill.total_tokens == sum(u["total_tokens"] for u in usages)
    assert served["billed_by_correlation_id"][key] == {
        "requests": 3,
        "prompt_tokens": bill.prompt_tokens,
        "completion_tokens": bill.completion_tokens,
        "total_tokens": bill.total_tokens,
    }
    assert (
        served["billed_prompt_tokens"] + served["billed_completion_tokens"]
        == (served["billed_tokens_total"])
    )
    assert math.isclose(served["billed_prompt_tokens"], snap.billed_prompt_tokens)
