"""Batch mode against a hostile provider: token-limit refusals at create, run-level
refusals (401/403/404) on every Files/Batches call, lost create answers with a lagging batch
list, and error texts that echo the post. The simulator stands behind ``SimProxy``."""

from __future__ import annotations

import itertools
import json
from collections import Counter, deque
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from backfill_assets.dispatch.pipeline import RunStopped
from backfill_assets.runner.verify import verify_store
from backfill_tests.conftest import import_records
from backfill_tests.dispatch.batch.conftest import (
    API_KEY,
    VERSIONS,
    StartSim,
    batch_options,
    key_of,
    records,
    rows,
    run_batch,
)
from backfill_tests.dispatch.batch.proxy import SimProxy, error_response


def _states(engine: Engine) -> Counter[str]:
    return Counter(r.state for r in rows(engine, "SELECT state FROM batch_submissions"))


def _complete(engine: Engine, proxy: SimProxy, n_keys: int) -> None:
    """Every key accepted and billed once, one batch per chunk, nothing rebilled or orphaned."""
    meter = proxy.sim.meter.snapshot()
    chunks = {r.chunk_id for r in rows(engine, "SELECT chunk_id FROM batch_submissions")}
    assert meter.batch_creates_by_chunk == dict.fromkeys(chunks, 1)
    per_key = Counter(c.correlation_id for c in meter.billed.values())
    assert len(per_key) == n_keys and set(per_key.values()) == {1}
    doc = verify_store(engine, VERSIONS).as_dict(require_complete=True)
    assert doc["ok"], doc["problems"]
    for tenant in doc["tenants"]:
        assert tenant["rebilled_tokens"] == 0 and tenant["orphan_attempts"] == 0
    assert rows(engine, "SELECT * FROM dead_letters") == []


def test_a_create_refused_for_the_token_limit_waits_with_back_off(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    data = records(["acme"], 16)
    import_records(engine, tmp_path, data)
    proxy = SimProxy(start_sim(), API_KEY)
    # The organisation's enqueued-token limit stays full for 1.2 s after the first create.
    proxy.refuse_for["create"] = (
        1.2,
        lambda: error_response(400, "token_limit_exceeded", "Enqueued token limit reached"),
    )
    logs: list[str] = []
    opts = batch_options(proxy.sim, max_lines=4, poll_seconds=0.05, transport=proxy.transport())
    run_batch(engine, ["acme"], opts, logs.append)

    refused = [t for t in proxy.times["create"] if t - proxy.times["create"][0] < 1.2]
    # Back-off doubling from 50 ms: a handful of creates in 1.2 s, not a tight loop.
    assert 2 <= len(refused) <= 7, len(refused)
    assert all(b - a >= 0.04 for a, b in itertools.pairwise(refused))
    waits = [
        float(line.rsplit("waiting ", 1)[1].split("s")[0])
        for line in logs
        if "enqueued-token limit reached" in line
    ]
    assert len(waits) >= len(refused) and waits == sorted(waits) and waits[-1] >= 4 * waits[0]
    # Submitted later: every chunk once, every key done once.
    assert set(_states(engine)) == {"booked"}
    _complete(engine, proxy, len(data))


def test_run_level_refusals_stop_the_run_and_leave_every_chunk_open(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    data = records(["acme"], 12)
    import_records(engine, tmp_path, data)
    proxy = SimProxy(start_sim(batch_processing_ms=300), API_KEY)
    opts = batch_options(proxy.sim, max_lines=4, transport=proxy.transport())
    wrong = "sk-someone-elses-key-0000000000"

    # 403 on create: nothing created, the uploaded chunk waits for the next run.
    proxy.refuse["create"] = deque(
        [error_response(403, "unsupported_country_region_territory", f"Forbidden for {wrong}")]
    )
    with pytest.raises(RunStopped) as info:
        run_batch(engine, ["acme"], opts)
    message = str(info.value)
    assert "403" in message and "/batches" in message and wrong not in message
    assert set(_states(engine)) <= {"intent", "uploaded"} and _states(engine)["uploaded"] == 1

    # 404 on the first status call: the batches were created and stay 'submitted'.
    proxy.refuse["retrieve"] = deque([error_response(404, "not_found", "No such batch")])
    with pytest.raises(RunStopped) as info:
        run_batch(engine, ["acme"], opts)
    assert "404" in str(info.value) and "/batches/" in str(info.value)
    assert _states(engine)["submitted"] >= 1

    # New keys; a create whose answer is lost, and the lookup's list answered 401.
    more = [{**r, "post_id": r["post_id"] + "b"} for r in records(["acme"], 4)]
    import_records(engine, tmp_path, more, "more.jsonl")
    proxy.lose_create_answers = 1
    proxy.refuse["list"] = deque(
        [error_response(401, "invalid_api_key", "Incorrect API key provided")]
    )
    with pytest.raises(RunStopped) as info:
        run_batch(engine, ["acme"], opts)
    assert "401" in str(info.value)

    # Nothing was closed, dead-lettered or counted against a key.
    assert not {"failed", "abandoned", "requeued"} & set(_states(engine))
    assert rows(engine, "SELECT * FROM dead_letters") == []
    assert rows(engine, "SELECT * FROM ledger_events WHERE type = 'error'") == []
    run_batch(engine, ["acme"], opts)
    assert set(_states(engine)) == {"booked"}
    _complete(engine, proxy, len(data) + len(more))
    assert {r.attempt_no for r in rows(engine, "SELECT attempt_no FROM batch_lines")} == {1}


def test_a_lost_create_answer_with_a_lagging_list_creates_one_batch(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    data = records(["acme"], 6)
    import_records(engine, tmp_path, data)
    proxy = SimProxy(start_sim(), API_KEY)
    opts = batch_options(proxy.sim, max_lines=50, transport=proxy.transport())
    # The create reaches the provider, its answer does not; the list shows it from its
    # third answer on.
    proxy.lose_create_answers = 1
    proxy.list_lag = 2
    logs: list[str] = []
    run_batch(engine, ["acme"], opts, logs.append)
    assert proxy.calls["list"] == 3  # looked again (and waited) instead of creating again
    assert any("re-attached to batch" in line for line in logs)
    _complete(engine, proxy, len(data))

    # The same after a crash: the next run finds the chunk 'uploaded', a create sent, and a
    # list that still hides the batch: it must look again, not create a second batch.
    more = [{**r, "post_id": r["post_id"] + "b"} for r in records(["acme"], 6)]
    import_records(engine, tmp_path, more, "more.jsonl")
    proxy.lose_create_answers = 1
    proxy.list_lag = 3
    proxy.refuse["list"] = deque(
        [error_response(401, "invalid_api_key", "Incorrect API key provided")]
    )
    with pytest.raises(Exception):  # noqa: B017 - the run stops, whatever it is called
        run_batch(engine, ["acme"], opts)
    assert _states(engine)["uploaded"] >= 1
    run_batch(engine, ["acme"], opts)
    _complete(engine, proxy, len(data) + len(more))


def test_provider_error_texts_never_store_the_post(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    data = records(["acme"], 24)
    import_records(engine, tmp_path, data)
    keys = [key_of(r) for r in data]
    text_of = {key_of(r): r["text"] for r in data}
    # A 400 and a 500 line, an expired batch, a failed batch and a refused create: each echoes.
    sim = start_sim(
        fault_by_key={keys[0]: "400", keys[1]: "500"}, batch_fail_count=1, batch_expire_count=2
    )
    proxy = SimProxy(sim, API_KEY)

    def echo_lines(content: bytes) -> bytes:
        out = []
        for raw in content.splitlines():
            line = json.loads(raw)
            text = text_of[line["custom_id"]]
            if line.get("error"):
                line["error"] = {"code": f"expired {text}", "message": f"not run: {text}"}
            elif line["response"]["status_code"] != 200:
                line["response"]["body"]["error"] = {
                    "message": f"Invalid content: {text} is not allowed",
                    "type": f"bad {text}",
                    "code": text[:30],
                }
            out.append(json.dumps(line).encode())
        return b"\n".join(out) + b"\n"

    async def echo_batch(batch: dict[str, Any]) -> dict[str, Any]:
        if batch.get("errors"):
            user = (await proxy.input_texts(batch["input_file_id"]))[0]
            post = user.split("<post>\n", 1)[1].rsplit("\n</post>", 1)[0]
            for item in batch["errors"]["data"]:
                item["message"] = f"Line 1: {user}"
                item["code"] = post[:40]
        return batch

    proxy.rewrite_content = echo_lines
    proxy.rewrite_batch = echo_batch
    proxy.echo_create_refusals = 1
    logs: list[str] = []
    opts = batch_options(sim, max_lines=3, transport=proxy.transport())
    run_batch(engine, ["acme"], opts, logs.append)
    run_batch(engine, ["acme"], opts, logs.append)

    states = _states(engine)
    assert states["failed"] >= 2 and states["booked"]  # the refused create, the failed batch
    dump = []
    for (table,) in rows(
        engine,
        "SELECT name FROM sqlite_master WHERE type = 'table'"
        if engine.dialect.name == "sqlite"
        else "SELECT tablename FROM pg_tables WHERE schemaname = 'public'",
    ):
        if table != "posts":
            dump.extend(str(v) for row in rows(engine, f"SELECT * FROM {table}") for v in row)
    stored = "\n".join(dump)
    assert "withheld" in stored and "HTTP 400" in stored  # the errors themselves are kept
    for text in text_of.values():
        assert text not in stored and text[:20] not in stored, text
        assert not any(text in line for line in logs)
