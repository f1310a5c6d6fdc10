"""Batch mode end to end against the simulator, on SQLite and PostgreSQL: same keys, ledger,
validation and outcomes as sync mode, at the batch price, with expiry, failures and limits."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.dispatch.pipeline import RunOptions, run_partitions
from backfill_assets.ledger.engines import engine_for
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.providers.ratelimit import LimiterConfig, LimiterRegistry
from backfill_assets.providersim import MeterSnapshot
from backfill_assets.runner.verify import verify_store
from backfill_tests.conftest import import_records
from backfill_tests.dispatch.batch.conftest import (
    API_KEY,
    MODEL,
    RETRY,
    RUBRIC,
    VERSIONS,
    StartSim,
    batch_options,
    key_of,
    records,
    rows,
    run_batch,
)
from backfill_tests.pipeline_helpers import refs_for


def _verified(engine: Engine) -> dict[str, int]:
    doc = verify_store(engine, VERSIONS).as_dict(require_complete=True)
    assert doc["ok"], doc["problems"]
    totals: Counter[str] = Counter()
    for tenant in doc["tenants"]:
        totals.update({k: v for k, v in tenant.items() if isinstance(v, int)})
    return dict(totals)


def _assert_ledger_is_the_meter(engine: Engine, meter: MeterSnapshot) -> None:
    """Every billed batch line is booked once, to the key and tenant it was sent for."""
    usage = rows(
        engine,
        "SELECT key, tenant_id, request_id, tokens_in, tokens_out FROM ledger_events"
        " WHERE type = 'usage'",
    )
    assert {r.request_id for r in usage} == set(meter.billed)
    for r in usage:
        call = meter.billed[r.request_id]
        assert (call.correlation_id, call.prompt_tokens, call.completion_tokens) == (
            r.key,
            r.tokens_in,
            r.tokens_out,
        )
    assert Counter(c.correlation_id for c in meter.billed.values()).most_common(1)[0][1] == 1


def _outcomes(engine: Engine) -> dict[str, str]:
    found = {r.key: "accepted" for r in rows(engine, "SELECT key FROM results")}
    for r in rows(engine, "SELECT key, outcome FROM dead_letters"):
        assert r.key not in found
        found[r.key] = r.outcome
    return found


def test_batch_mode_gives_the_sync_labels_at_half_the_price(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    data = records(["acme", "globex"], 40)
    import_records(engine, tmp_path, data)
    batch_sim = start_sim(seed=2)
    reports = run_batch(engine, ["acme", "globex"], batch_options(batch_sim, max_lines=3))

    # The same corpus through sync mode, on its own store and simulator.
    sync_engine = engine_for(f"sqlite:///{tmp_path / 'sync.db'}")
    import_records(sync_engine, tmp_path, data, "sync.jsonl")
    sync_sim = start_sim(seed=2)
    limiter = LimiterRegistry().get("sync", LimiterConfig())
    run_partitions(
        sync_engine,
        refs_for(["acme", "globex"]),
        lambda: OpenAIHttpModel(
            base_url=sync_sim.base_url, model=MODEL, api_key=API_KEY, limiter=limiter
        ),
        VERSIONS,
        RUBRIC,
        "sync",
        RunOptions(retry=RETRY),
    )

    labels = dict(rows(engine, "SELECT key, label FROM results"))
    assert labels == dict(rows(sync_engine, "SELECT key, label FROM results"))
    assert set(labels) == {key_of(r) for r in data}
    batch_meter, sync_meter = batch_sim.meter.snapshot(), sync_sim.meter.snapshot()
    assert batch_meter.billed_batch_tokens == sync_meter.billed_tokens_total
    assert batch_meter.responses_by_status == {}  # no synchronous call at all
    _assert_ledger_is_the_meter(engine, batch_meter)
    usage = "SELECT sum(cost_nanos) FROM ledger_events WHERE type = 'usage'"
    [(booked,)] = rows(engine, usage)
    [(sync_booked,)] = rows(sync_engine, usage)
    # Exact, in nano-dollars, against the simulator's own priced meter (batch: half price).
    assert booked == batch_meter.billed_cost_nanos > 0
    assert sync_booked == sync_meter.billed_cost_nanos == 2 * booked
    tiers = "SELECT DISTINCT service_tier FROM ledger_events WHERE type = 'usage'"
    assert rows(engine, tiers) == [("batch",)] and rows(sync_engine, tiers) == [("standard",)]
    assert sum(r.stats.cost_nanos for r in reports) == booked
    verified = _verified(engine)
    assert verified["rebilled_tokens"] == 0 and verified["orphan_attempts"] == 0

    # Chunks: at most 3 lines, one partition each, one create per chunk, custom_id = key.
    subs = rows(engine, "SELECT chunk_id, tenant_id, slice, lines, state FROM batch_submissions")
    assert {s.state for s in subs} == {"booked"} and max(s.lines for s in subs) <= 3
    assert batch_meter.batch_creates_by_chunk == {s.chunk_id: 1 for s in subs}
    mixed = rows(
        engine,
        "SELECT l.chunk_id FROM batch_lines l JOIN batch_submissions s USING (chunk_id)"
        " WHERE l.tenant_id <> s.tenant_id OR l.slice <> s.slice",
    )
    assert mixed == []
    tenant_of = {key_of(r): r["tenant_id"] for r in data}
    batch_tenant = {
        r.batch_id: r.tenant_id
        for r in rows(engine, "SELECT batch_id, tenant_id FROM batch_submissions")
    }
    for call in batch_meter.billed.values():
        assert tenant_of[call.correlation_id] == batch_tenant[call.batch_id]
    assert sum(r.stats.calls for r in reports) == len(data)


def test_each_line_failure_ends_in_its_outcome(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    data = records(["acme"], 24)
    import_records(engine, tmp_path, data)
    keys = [key_of(r) for r in data]
    pinned = {keys[0]: "400", keys[1]: "500", keys[2]: "malformed", keys[3]: "wrong_key"}
    # A 503 on a key's first send only: resubmitted once, then accepted.
    flaky = {"kind": "503", "rate": 0.25}
    sim = start_sim(fault_by_key=pinned, faults=[flaky], seed=9)
    reports = run_batch(engine, ["acme"], batch_options(sim))

    found = _outcomes(engine)
    assert set(found) == set(keys)
    assert found[keys[0]] == "transport_rejected"
    assert found[keys[1]] == "retry_exhausted"
    assert found[keys[2]] == found[keys[3]] == "schema_rejected"
    meter = sim.meter.snapshot()
    sends = meter.calls_by_correlation_id
    assert (sends[keys[0]], sends[keys[1]], sends[keys[2]]) == (1, RETRY.max_attempts, 1)
    resent = {k for k in keys[4:] if sends[k] > 1}
    assert resent, "the 503 rule should have hit some keys"
    assert {found[k] for k in keys[4:]} <= {"accepted", "retry_exhausted"}
    # Every retriable line that was not the key's last attempt was sent again, once.
    assert sum(r.stats.retries for r in reports) == sum(n - 1 for n in sends.values())
    _assert_ledger_is_the_meter(engine, meter)
    verified = _verified(engine)
    assert verified["rebilled_tokens"] == 0 and verified["orphan_attempts"] == 0
    # Each resend was a new chunk holding only failed lines.
    assert max(meter.batch_creates_by_chunk.values()) == 1
    dead = dict(rows(engine, "SELECT key, reason FROM dead_letters"))
    assert dead[keys[0]].startswith("HTTP 400")
    assert "attempts" in dead[keys[1]]


def test_an_expired_batch_resubmits_only_its_unfinished_lines(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    data = records(["acme"], 40)
    import_records(engine, tmp_path, data)
    sim = start_sim(batch_expire_count=1, batch_expire_finished_share=0.7, seed=4)
    run_batch(engine, ["acme"], batch_options(sim))

    [expired] = rows(
        engine,
        "SELECT chunk_id, lines, requests_completed, requests_failed FROM batch_submissions"
        " WHERE provider_status = 'expired'",
    )
    finished = math.floor(0.7 * expired.lines)
    assert (expired.requests_completed, expired.requests_failed) == (
        finished,
        expired.lines - finished,
    )
    sent = {
        r.key
        for r in rows(engine, "SELECT key FROM batch_lines WHERE chunk_id = :c", c=expired.chunk_id)
    }
    billed = {c.correlation_id for c in sim.meter.snapshot().billed.values()}
    resubmitted = rows(
        engine,
        "SELECT l.chunk_id, l.key, l.attempt_no FROM batch_lines l WHERE l.key IN"
        " (SELECT key FROM batch_lines WHERE chunk_id = :c) AND l.chunk_id <> :c",
        c=expired.chunk_id,
    )
    # Exactly the unfinished 30% went into exactly one new chunk, as second attempts.
    assert len(resubmitted) == expired.lines - finished
    assert len({r.chunk_id for r in resubmitted}) == 1
    assert {r.attempt_no for r in resubmitted} == {2}
    assert {r.key for r in resubmitted} == sent - {
        r.key
        for r in rows(
            engine,
            "SELECT key FROM ledger_events WHERE type = 'usage' AND attempt_id LIKE :p",
            p=f"{expired.chunk_id}:%",
        )
    }
    meter = sim.meter.snapshot()
    # Finished lines were billed once, in the expired batch; nothing is billed twice.
    assert len(billed) == len(meter.billed) == len(data)
    _assert_ledger_is_the_meter(engine, meter)
    verified = _verified(engine)
    assert verified["done"] == len(data) and verified["rebilled_tokens"] == 0
    expired_errors = rows(
        engine,
        "SELECT message FROM ledger_events WHERE type = 'error' AND attempt_id LIKE :p",
        p=f"{expired.chunk_id}:%",
    )
    assert {r.message for r in expired_errors} == {"batch_expired: not run by the batch"}


def test_token_limit_and_status_429s_are_waited_out(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    data = records(["acme", "globex"], 30)
    import_records(engine, tmp_path, data)
    # Room for about two chunks of 4 lines (~260 prompt tokens each) at once; 10 status
    # polls per second with a bucket of 2.
    sim = start_sim(
        enqueued_token_limit=2500,
        batch_poll_rpm=600,
        burst_seconds=0.2,
        batch_processing_ms=150,
        seed=6,
    )
    logs: list[str] = []
    reports = run_batch(engine, ["acme", "globex"], batch_options(sim, max_lines=4), logs.append)

    meter = sim.meter.snapshot()
    assert meter.batch_polls_rate_limited > 0
    assert sum(r.stats.rate_limited for r in reports) == meter.batch_polls_rate_limited
    requeued = rows(
        engine, "SELECT chunk_id, errors FROM batch_submissions WHERE state = 'requeued'"
    )
    assert requeued, "the enqueued-token limit should have refused some batches"
    assert all("token_limit_exceeded" in r.errors for r in requeued)
    assert any("enqueued-token limit reached" in line for line in logs)
    assert max(meter.batch_creates_by_chunk.values()) == 1
    assert set(_outcomes(engine).values()) == {"accepted"}
    _assert_ledger_is_the_meter(engine, meter)
    verified = _verified(engine)
    assert verified["done"] == len(data) and verified["orphan_attempts"] == 0
    # A requeued chunk never ran: its lines do not count as attempts.
    assert {r.attempt_no for r in rows(engine, "SELECT attempt_no FROM batch_lines")} == {1}


def test_a_batch_failing_validation_is_reported_with_its_errors(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    data = records(["acme"], 48)
    import_records(engine, tmp_path, data)
    sim = start_sim(batch_max_lines=3)
    logs: list[str] = []
    run_batch(engine, ["acme"], batch_options(sim, max_lines=5), logs.append)

    failed = rows(
        engine, "SELECT chunk_id, lines, errors FROM batch_submissions WHERE state = 'failed'"
    )
    assert failed and all(r.lines > 3 for r in failed)
    for r in failed:
        assert [e["code"] for e in json.loads(r.errors)] == ["too_many_requests"]
    assert sum("failed validation" in line and "too_many_requests" in line for line in logs) == len(
        failed
    )
    verified = verify_store(engine, VERSIONS)
    [report] = verified.reports
    # Reported, not dead-lettered: the keys stay missing for a fixed run; no attempt is orphaned.
    assert report.missing == sum(r.lines for r in failed) and report.dead == 0
    assert (
        report.orphan_attempts == 0
        and report.billed_tokens == sim.meter.snapshot().billed_tokens_total
    )

    run_batch(engine, ["acme"], batch_options(sim, max_lines=3))
    assert set(_outcomes(engine).values()) == {"accepted"}
    assert _verified(engine)["rebilled_tokens"] == 0


def test_budget_reserves_whole_chunks_and_defers_the_rest(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    data = records(["acme"], 48)
    import_records(engine, tmp_path, data)
    sim = start_sim()
    cap = 2500
    reports = run_batch(engine, ["acme"], batch_options(sim, budget=cap))

    deferred = sum(r.stats.outcomes["deferred"] for r in reports)
    done = len(rows(engine, "SELECT key FROM results"))
    assert deferred and done and done + deferred == len(data)
    [(billed,)] = rows(engine, "SELECT billed_tokens FROM tenants WHERE tenant_id = 'acme'")
    assert 0 < billed <= cap
    assert rows(engine, "SELECT * FROM budget_reservations") == []
    # Nothing was sent that was not reserved: every chunk's reservation covers its lines.
    assert sim.meter.snapshot().billed_batch_tokens == billed

    run_batch(engine, ["acme"], batch_options(sim))
    assert len(rows(engine, "SELECT key FROM results")) == len(data)


def test_an_interrupted_apply_is_finished_without_booking_twice(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    data = records(["acme"], 20)
    import_records(engine, tmp_path, data)
    sim = start_sim()
    run_batch(engine, ["acme"], batch_options(sim))
    created = sim.meter.snapshot().batch_creates_total
    before = rows(engine, "SELECT count(*), sum(tokens_in + tokens_out) FROM ledger_events")
    # As if the process died after some lines of a chunk were committed, before 'booked'.
    [chunk] = rows(engine, "SELECT chunk_id FROM batch_submissions ORDER BY lines DESC LIMIT 1")
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE batch_submissions SET state = 'ended' WHERE chunk_id = :c"),
            {"c": chunk.chunk_id},
        )
    logs: list[str] = []
    run_batch(engine, ["acme"], batch_options(sim), logs.append)

    assert rows(engine, "SELECT count(*), sum(tokens_in + tokens_out) FROM ledger_events") == before
    [(state,)] = rows(
        engine, "SELECT state FROM batch_submissions WHERE chunk_id = :c", c=chunk.chunk_id
    )
    assert state == "booked"
    assert any(f"chunk {chunk.chunk_id}" in line and "resuming at 'ended'" in line for line in logs)
    assert sim.meter.snapshot().batch_creates_total == created  # done keys: no new batch


def test_no_post_text_or_key_in_the_submission_ledger(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    data = records(["acme"], 30)
    import_records(engine, tmp_path, data)
    keys = [key_of(r) for r in data]
    sim = start_sim(fault_by_key={keys[0]: "400"}, batch_max_lines=1)
    run_batch(engine, ["acme"], batch_options(sim, max_lines=2))
    run_batch(engine, ["acme"], batch_options(sim, max_lines=1))
    dump = "\n".join(
        str(v)
        for table in ("batch_submissions", "batch_lines", "ledger_events", "dead_letters")
        for row in rows(engine, f"SELECT * FROM {table}")
        for v in row
    )
    assert "too_many_requests" in dump and "HTTP 400" in dump  # the errors are there
    for needle in [API_KEY, *(r["text"] for r in data), "marker-0"]:
        assert needle not in dump, needle
