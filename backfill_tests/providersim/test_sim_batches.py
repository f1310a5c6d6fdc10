"""The simulator's Files and Batch APIs over real HTTP: states, output shape, expiry, limits."""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from typing import Any

import httpx

from backfill_assets.providersim import (
    MeterSnapshot,
    SimConfig,
    Simulator,
    add_cli_arguments,
    config_from_args,
)
from backfill_tests.providersim.batchkit import FAST
from backfill_tests.providersim.batchkit import create as _create
from backfill_tests.providersim.batchkit import file_lines as _file
from backfill_tests.providersim.batchkit import jsonl as _jsonl
from backfill_tests.providersim.batchkit import request_lines as _lines
from backfill_tests.providersim.batchkit import submit as _submit
from backfill_tests.providersim.batchkit import upload as _upload
from backfill_tests.providersim.batchkit import wait as _wait


def test_a_batch_runs_through_its_states_and_answers_by_custom_id(
    start_sim: Callable[..., Simulator], chat_body: Callable[..., dict[str, Any]], key_for
) -> None:
    sim = start_sim(**FAST)
    keys = [key_for(f"k{i}") for i in range(30)]
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        upload = _upload(client, _jsonl(_lines(chat_body, keys)))
        assert upload.status_code == 200
        info = upload.json()
        assert (info["object"], info["purpose"]) == ("file", "batch")
        assert client.get(f"/files/{info['id']}").json()["bytes"] == info["bytes"]
        assert client.get(f"/files/{info['id']}/content").content == _jsonl(_lines(chat_body, keys))
        created = _create(client, info["id"], metadata={"chunk_id": "c1", "tenant": "acme"}).json()
        assert created["status"] == "validating" and created["metadata"]["tenant"] == "acme"
        batch, seen = _wait(client, created)
        output = client.get(f"/files/{batch['output_file_id']}/content").content.splitlines()

    assert seen[0] == "validating" and seen[-1] == "completed"
    assert set(seen) <= {"validating", "in_progress", "finalizing", "completed"}
    assert batch["request_counts"] == {"total": 30, "completed": 30, "failed": 0}
    assert batch["error_file_id"] is None and batch["completed_at"] >= batch["created_at"]
    lines = [json.loads(line) for line in output]
    assert sorted(line["custom_id"] for line in lines) == sorted(keys)
    assert [line["custom_id"] for line in lines] != keys  # the output order is not the input's
    for line in lines:
        response = line["response"]
        assert response["status_code"] == 200 and line["error"] is None
        content = json.loads(response["body"]["choices"][0]["message"]["content"])
        assert content["correlation_id"] == line["custom_id"]
    meter = sim.meter.snapshot()
    assert meter.batch_creates_by_chunk == {"c1": 1} and meter.files_uploaded == 1
    assert len(meter.billed) == 30 and {c.batch_id for c in meter.billed.values()} == {batch["id"]}
    assert (
        meter.billed_batch_tokens
        == meter.billed_tokens_total
        == sum(json.loads(x)["response"]["body"]["usage"]["total_tokens"] for x in output)
    )
    assert meter.responses_by_status == {}  # batch traffic is not chat traffic


def test_line_faults_go_to_the_error_file_and_only_answers_are_billed(
    start_sim: Callable[..., Simulator], chat_body: Callable[..., dict[str, Any]], key_for
) -> None:
    keys = [key_for(f"f{i}") for i in range(6)]
    pins = {keys[0]: "400", keys[1]: "500", keys[2]: "429", keys[3]: "malformed"}
    sim = start_sim(fault_by_key=pins, **FAST)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        batch, _ = _wait(client, _submit(client, _lines(chat_body, keys)))
        errors, output = (
            _file(client, batch["error_file_id"]),
            _file(client, batch["output_file_id"]),
        )
    assert batch["request_counts"] == {"total": 6, "completed": 3, "failed": 3}
    statuses = {k: line["response"]["status_code"] for k, line in errors.items()}
    assert statuses == {keys[0]: 400, keys[1]: 500, keys[2]: 429}
    assert errors[keys[0]]["response"]["body"]["error"]["type"] == "invalid_request_error"
    assert set(output) == {keys[3], keys[4], keys[5]}
    assert {c.correlation_id for c in sim.meter.snapshot().billed.values()} == set(output)


def test_expired_batch_bills_its_finished_lines_and_expires_the_rest(
    start_sim: Callable[..., Simulator], chat_body: Callable[..., dict[str, Any]], key_for
) -> None:
    sim = start_sim(batch_expire_count=1, batch_expire_finished_share=0.7, **FAST)
    keys = [key_for(f"e{i}") for i in range(20)]
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        first, _ = _wait(client, _submit(client, _lines(chat_body, keys), "a"))
        errors, output = (
            _file(client, first["error_file_id"]),
            _file(client, first["output_file_id"]),
        )
        second, _ = _wait(client, _submit(client, _lines(chat_body, list(errors)), "b"))
    assert first["status"] == "expired" and first["expired_at"] is not None
    assert len(output) == math.floor(0.7 * 20) and len(errors) == 20 - len(output)
    assert {line["error"]["code"] for line in errors.values()} == {"batch_expired"}
    assert all(line["response"] is None for line in errors.values())
    assert second["status"] == "completed"  # only the first batch expires
    billed = [c.correlation_id for c in sim.meter.snapshot().billed.values()]
    assert sorted(billed) == sorted(keys)  # finished lines billed once, expired ones not at all


def test_validation_failures_fail_the_whole_batch(
    start_sim: Callable[..., Simulator], chat_body: Callable[..., dict[str, Any]], key_for
) -> None:
    sim = start_sim(batch_max_lines=3, **FAST)
    good = _lines(chat_body, [key_for("v1"), key_for("v2")])
    cases = {
        "duplicate_custom_id": [good[0], good[0]],
        "mismatched_endpoint": [{**good[0], "url": "/v1/embeddings"}],
        "too_many_requests": _lines(chat_body, [key_for(f"m{i}") for i in range(4)]),
        "invalid_json_line": None,
    }
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        for code, items in cases.items():
            content = b"{not json}\n" if items is None else _jsonl(items)
            file_id = _upload(client, content).json()["id"]
            batch, seen = _wait(client, _create(client, file_id).json())
            assert seen == ["validating", "failed"], code
            assert code in {e["code"] for e in batch["errors"]["data"]}, code
            assert batch["output_file_id"] is None and batch["failed_at"] is not None
        # Requests the API refuses outright, before any batch exists.
        file_id = _upload(client, _jsonl(good)).json()["id"]
        assert _create(client, file_id, completion_window="1h").status_code == 400
        assert _create(client, file_id, endpoint="/v1/images").status_code == 400
        many = {f"k{i}": "v" for i in range(17)}
        assert _create(client, file_id, metadata=many).status_code == 400
        assert _create(client, "file-nope").status_code == 404
        assert _upload(client, _jsonl(good), purpose="nonsense").status_code == 400
        assert client.post("/files", content=b"x").status_code == 400
    assert sim.meter.snapshot().billed == {}


def test_enqueued_token_limit_fails_a_batch_until_earlier_ones_finish(
    start_sim: Callable[..., Simulator], chat_body: Callable[..., dict[str, Any]], key_for
) -> None:
    sim = start_sim(enqueued_token_limit=4000, **{**FAST, "batch_processing_ms": 300})
    batch_of = [_lines(chat_body, [key_for(f"t{n}-{i}") for i in range(10)]) for n in range(3)]
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        first = _submit(client, batch_of[0], "a")
        time.sleep(0.01)  # first is in progress now
        second, _ = _wait(client, _submit(client, batch_of[1], "b"))
        assert _wait(client, first)[0]["status"] == "completed"
        third, _ = _wait(client, _submit(client, batch_of[2], "c"))
    assert second["status"] == "failed"
    [error] = second["errors"]["data"]
    assert error["code"] == "token_limit_exceeded" and "4,000" in error["message"]
    assert third["status"] == "completed"


def test_status_polls_are_rate_limited_with_retry_after(
    start_sim: Callable[..., Simulator], chat_body: Callable[..., dict[str, Any]], key_for
) -> None:
    sim = start_sim(batch_poll_rpm=60, **FAST)  # one per second, bucket of one
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        batch = _submit(client, _lines(chat_body, [key_for("p")]))
        assert client.get(f"/batches/{batch['id']}").status_code == 200
        limited = client.get(f"/batches/{batch['id']}")
        listed = client.get("/batches")
    assert limited.status_code == 429 and listed.status_code == 429
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert 0 < float(limited.headers["retry-after-ms"]) <= 1000
    meter = sim.meter.snapshot()
    assert (meter.batch_polls, meter.batch_polls_rate_limited) == (3, 2)


def test_list_pages_newest_first_with_metadata_and_cancel(
    start_sim: Callable[..., Simulator], chat_body: Callable[..., dict[str, Any]], key_for
) -> None:
    sim = start_sim(**{**FAST, "batch_processing_ms": 5000})
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        created = [
            _submit(client, _lines(chat_body, [key_for(f"l{n}"), key_for(f"m{n}")]), f"c{n}")
            for n in range(5)
        ]
        ids = [b["id"] for b in created]
        page1 = client.get("/batches", params={"limit": 2}).json()
        page2 = client.get("/batches", params={"limit": 2, "after": page1["last_id"]}).json()
        page3 = client.get("/batches", params={"limit": 2, "after": page2["last_id"]}).json()
        cancelled = client.post(f"/batches/{ids[0]}/cancel").json()
        final, _ = _wait(client, cancelled)
        errors = _file(client, final["error_file_id"])
        admin = f"http://127.0.0.1:{sim.port}"
        meter = MeterSnapshot.from_dict(client.get(f"{admin}/_sim/meter").json())
    listed = [b["id"] for page in (page1, page2, page3) for b in page["data"]]
    assert listed == list(reversed(ids))
    assert (page1["has_more"], page2["has_more"], page3["has_more"]) == (True, True, False)
    assert [b["metadata"]["chunk_id"] for b in page1["data"]] == ["c4", "c3"]
    assert cancelled["status"] == "cancelling" and final["status"] == "cancelled"
    assert {line["error"]["code"] for line in errors.values()} == {"batch_cancelled"}
    assert meter.batch_creates_by_chunk == {f"c{n}": 1 for n in range(5)}
    assert meter.batch_creates_total == 5 and meter.billed == {}


def test_a_slow_cancel_stays_cancelling_and_bills_what_ran_when_it_ends(
    start_sim: Callable[..., Simulator], chat_body: Callable[..., dict[str, Any]], key_for
) -> None:
    # Half of the lines have run when the cancel is asked; the cancel takes 400 ms more.
    sim = start_sim(**{**FAST, "batch_processing_ms": 400, "batch_cancel_ms": 400})
    keys = [key_for(f"s{i}") for i in range(20)]
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        created = _submit(client, _lines(chat_body, keys), "slow")
        time.sleep(0.2)
        asked = time.monotonic()
        cancelling = client.post(f"/batches/{created['id']}/cancel").json()
        time.sleep(0.2)
        still = client.get(f"/batches/{created['id']}").json()
        billed_meanwhile = len(sim.meter.snapshot().billed)
        final, _ = _wait(client, cancelling)
        took = time.monotonic() - asked
    assert cancelling["status"] == still["status"] == "cancelling" and billed_meanwhile == 0
    assert final["status"] == "cancelled" and took >= 0.4
    assert final["cancelled_at"] >= final["cancelling_at"]
    ran = final["request_counts"]["completed"]
    assert 0 < ran < len(keys) and final["request_counts"]["failed"] == len(keys) - ran
    billed = sim.meter.snapshot().billed_by_correlation_id
    assert len(billed) == ran and all(b.requests == 1 for b in billed.values())


def test_cli_arguments_configure_the_batch_api() -> None:
    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)
    ns = parser.parse_args(
        [
            "--batch-processing-ms",
            "500",
            "--batch-expire-count",
            "2",
            "--batch-expire-finished-share",
            "0.5",
            "--enqueued-token-limit",
            "90000",
            "--batch-poll-rpm",
            "120",
            "--batch-cancel-ms",
            "90000",
        ]
    )
    assert config_from_args(ns) == SimConfig(
        batch_processing_ms=500,
        batch_expire_count=2,
        batch_expire_finished_share=0.5,
        enqueued_token_limit=90000,
        batch_poll_rpm=120,
        batch_cancel_ms=90000,
    )
