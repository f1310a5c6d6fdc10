"""Batch mode against the simulator's own hostile modes: create refusals
for the enqueued-token limit, creates whose answer never arrives with a lagging batch list,
every usage shape in output lines, error texts that echo the request, a wrong key."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from backfill_assets.config.variables import HttpSettings
from backfill_assets.dispatch.pipeline import RunOptions, RunStopped
from backfill_assets.domain.policy.rubric import call_token_bound
from backfill_assets.providersim import Simulator
from backfill_assets.runner.verify import verify_store
from backfill_tests.conftest import import_records
from backfill_tests.dispatch.batch.conftest import (
    RUBRIC,
    VERSIONS,
    StartSim,
    batch_options,
    key_of,
    records,
    rows,
    run_batch,
)


def _options(sim: Simulator, read_timeout_s: float = 60.0, **batch: object) -> RunOptions:
    opts = batch_options(sim, **batch)  # type: ignore[arg-type]
    assert opts.batch is not None and opts.batch.endpoint is not None
    http = HttpSettings(read_timeout_s=read_timeout_s)
    endpoint = dataclasses.replace(opts.batch.endpoint, http=http)
    return dataclasses.replace(opts, batch=dataclasses.replace(opts.batch, endpoint=endpoint))


def _done_once(engine: Engine, sim: Simulator, n_keys: int) -> None:
    meter = sim.meter.snapshot()
    chunks = {r.chunk_id for r in rows(engine, "SELECT chunk_id FROM batch_submissions")}
    assert meter.batch_creates_by_chunk == dict.fromkeys(chunks, 1)  # one batch per chunk
    per_key = Counter(c.correlation_id for c in meter.billed.values())
    assert len(per_key) == n_keys and set(per_key.values()) == {1}
    doc = verify_store(engine, VERSIONS).as_dict(require_complete=True)
    assert doc["ok"], doc["problems"]
    assert all(t["rebilled_tokens"] == 0 for t in doc["tenants"])


def test_create_refusals_and_lost_create_answers_give_one_batch_per_chunk(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    data = records(["acme"], 12)
    import_records(engine, tmp_path, data)
    # Three creates refused for the enqueued-token limit, then the first batch is created but
    # its answer never arrives (1 s, the client gives up after 0.3 s), and the list shows a
    # batch only 2 s after its create.
    sim = start_sim(
        batch_create_token_limit_count=3,
        batch_create_hang_count=1,
        hang_seconds=1.0,
        batch_list_lag_ms=2000,
    )
    logs: list[str] = []
    run_batch(engine, ["acme"], _options(sim, 0.3, max_lines=50, poll_seconds=0.02), logs.append)

    meter = sim.meter.snapshot()
    chunks = len(rows(engine, "SELECT chunk_id FROM batch_submissions"))
    # Every refused create waited (no tight loop), and the unanswered one was looked up
    # until the lagging list showed it instead of being sent again.
    assert meter.batch_create_requests == chunks + 3
    assert sum("enqueued-token limit reached" in line for line in logs) == 3
    assert any("re-attached to batch" in line for line in logs)
    _done_once(engine, sim, len(data))


@pytest.mark.parametrize("shape", ["none", "total_only", "completion_null", "details_null"])
def test_every_usage_shape_of_a_batch_line_is_booked(
    engine: Engine, tmp_path: Path, start_sim: StartSim, shape: str
) -> None:
    data = records(["acme"], 8)
    import_records(engine, tmp_path, data)
    sim = start_sim(batch_usage_shape=shape)
    run_batch(engine, ["acme"], batch_options(sim))

    _done_once(engine, sim, len(data))
    bounds = {key_of(r): call_token_bound(RUBRIC, key_of(r), r["text"]) for r in data}
    billed = {c.correlation_id: c for c in sim.meter.snapshot().billed.values()}
    for r in rows(
        engine,
        "SELECT key, tokens_in, tokens_out, usage_shape, bound_tokens, message"
        " FROM ledger_events WHERE type = 'usage'",
    ):
        assert r.bound_tokens == bounds[r.key]
        if shape == "none":  # at the bound, flagged, never 0
            assert r.usage_shape == "missing" and r.tokens_in + r.tokens_out == bounds[r.key]
            assert r.message.startswith("usage_missing")
        elif shape == "total_only":
            assert (r.usage_shape, r.tokens_in) == ("total", billed[r.key].total_tokens)
        else:  # the split is known from prompt and total
            assert r.usage_shape == "split"
            assert (r.tokens_in, r.tokens_out) == (
                billed[r.key].prompt_tokens,
                billed[r.key].completion_tokens,
            )


def test_echoed_errors_never_store_the_post(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    data = records(["acme"], 16)
    import_records(engine, tmp_path, data)
    keys = [key_of(r) for r in data]
    sim = start_sim(
        echo_errors=True, fault_by_key={keys[0]: "400", keys[1]: "500"}, batch_fail_count=1
    )
    logs: list[str] = []
    run_batch(engine, ["acme"], batch_options(sim, max_lines=4), logs.append)

    stored = "\n".join(
        str(v)
        for table in ("batch_submissions", "batch_lines", "ledger_events", "dead_letters")
        for row in rows(engine, f"SELECT * FROM {table}")
        for v in row
    )
    assert "HTTP 400" in stored and "invalid_request" in stored  # the errors are kept
    for r in data:
        assert r["text"] not in stored and r["text"] not in "\n".join(logs), r["text"]


def test_a_wrong_key_stops_the_run_with_every_key_pending(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    data = records(["acme"], 6)
    import_records(engine, tmp_path, data)
    # The run sends conftest's API_KEY; this provider expects another one.
    locked = start_sim(api_key="sk-only-the-right-one-0123456789")
    with pytest.raises(RunStopped, match="HTTP 401"):
        run_batch(engine, ["acme"], batch_options(locked))
    assert {r.state for r in rows(engine, "SELECT state FROM batch_submissions")} == {"intent"}
    assert rows(engine, "SELECT * FROM dead_letters") == []
