"""The money path under a hostile provider: strict caps whatever the tokenizer, every
usage shape booked once and never as 0, a bill past the bound stops the tenant, run-level errors
stop the run with every key pending, Retry-After bounded.

The fake model and an ``httpx.MockTransport`` play the provider here; the simulator-based
versions of the same guarantees live in ``backfill_tests/providers/``.
"""

from __future__ import annotations

import json
import math
import uuid
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import Engine

from backfill_assets.cli import build_parser
from backfill_assets.config.settings import Settings
from backfill_assets.config.variables import ChecksSettings, HttpSettings, RunSettings
from backfill_assets.defs.labels.checks import check_results_for
from backfill_assets.dispatch.partition_run import DispatchHalted
from backfill_assets.dispatch.pipeline import RunOptions, RunStopped, run_partitions
from backfill_assets.domain.work.outcomes import RetryPolicy
from backfill_assets.providers.models.fake import FakeModel
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.providers.models.rules import count_tokens
from backfill_assets.providers.models.timeouts import HttpTimeouts
from backfill_assets.providers.ratelimit import EndpointLimiter, LimiterConfig
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import (
    FAST_RETRY,
    RUBRIC,
    VERSIONS,
    calls,
    count,
    refs_for,
    run,
    total,
    varied_corpus,
    verify,
)

KEY = "sk-live-7d41c0ffee9a8b7c6d5e4f3a"


def billed_by_tenant(engine: Engine) -> dict[str, int]:
    """Usage booked in the ledger per tenant."""
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT tenant_id, sum(tokens_in + tokens_out) FROM ledger_events"
            " WHERE type = 'usage' GROUP BY tenant_id"
        ).all()
    return {t: int(n) for t, n in rows}


def usage_per_key(engine: Engine) -> Counter[str]:
    """Usage events per key."""
    with engine.connect() as conn:
        keys = conn.exec_driver_sql("SELECT key FROM ledger_events WHERE type = 'usage'").all()
    return Counter(k for (k,) in keys)


# -- strict caps -------------------------------------------------------------------------------


def test_cap_is_strict_when_the_provider_bills_three_times_the_estimate(
    engine: Engine, tmp_path: Path
) -> None:
    """Cap 20,000 at concurrency 64 against 3x over-billing: no tenant passes the cap."""
    tenants = ["acme", "globex", "initech"]
    import_records(engine, tmp_path, varied_corpus(tenants, 150))
    cap = 20_000
    model = FakeModel(model=VERSIONS.model, overbill_factor=3.0, latency_ms=2)
    opts = RunOptions(run=RunSettings(concurrency=64, tenant_budget_tokens=cap), retry=FAST_RETRY)
    reports, _ = run(engine, tenants, adapter=model, options=opts)
    billed = billed_by_tenant(engine)
    assert set(billed) == set(tenants)
    assert all(0 < b <= cap for b in billed.values()), billed
    # The ledger is the provider's meter: every billed token is booked, once.
    assert sum(billed.values()) == model.billed_tokens
    assert max(usage_per_key(engine).values()) == 1
    # The cap binds: keys are left for later, not dropped.
    deferred = total(reports, "deferred")
    assert deferred > 0 and sum(r.missing for r in verify(engine).reports) == deferred
    assert count(engine, "SELECT count(*) FROM budget_reservations") == 0


# -- usage shapes (fake) -----------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["total", "missing"])
def test_unusual_usage_is_booked_once_never_as_zero(
    engine: Engine, tmp_path: Path, shape: str
) -> None:
    import_records(engine, tmp_path, varied_corpus(["acme"], 60))
    model = FakeModel(model=VERSIONS.model, usage_shape=shape)
    reports, _ = run(engine, ["acme"], adapter=model)
    assert total(reports, "accepted") == 60 and calls(reports) == 60
    per_key = usage_per_key(engine)
    assert len(per_key) == 60 and set(per_key.values()) == {1}
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT usage_shape, tokens_in, tokens_out, bound_tokens, message FROM ledger_events"
            " WHERE type = 'usage'"
        ).all()
    assert {r.usage_shape for r in rows} == {shape}
    assert all(r.tokens_in + r.tokens_out > 0 for r in rows)
    if shape == "total":
        assert sum(r.tokens_in for r in rows) == model.billed_tokens
        assert all(r.tokens_out == 0 for r in rows)
    else:
        # Unknown usage is booked at the reserved bound (at least what was billed), flagged.
        assert all(r.tokens_in + r.tokens_out == r.bound_tokens for r in rows)
        assert sum(r.bound_tokens for r in rows) >= model.billed_tokens
        assert all(r.message.startswith("usage_missing") for r in rows)
    audited = verify(engine)
    assert audited.as_dict(require_complete=True)["ok"]
    assert audited.reports[0].usage_missing == (60 if shape == "missing" else 0)
    second, _ = run(engine, ["acme"], adapter=model)
    assert calls(second) == 0


# -- billed past the bound ----------------------------------------------------------------------


def test_a_bill_past_the_bound_stops_that_tenant_only(engine: Engine, tmp_path: Path) -> None:
    import_records(engine, tmp_path, varied_corpus(["acme", "globex"], 80))
    # x10 on a ~4-bytes-a-token count bills more than the prompt has bytes: no tokenizer can.
    hostile = FakeModel(model=VERSIONS.model, overbill_factor=10.0)
    concurrency = 4
    reports, _ = run(
        engine,
        ["acme"],
        adapter=hostile,
        options=RunOptions(run=RunSettings(concurrency=concurrency), retry=FAST_RETRY),
    )
    over = count(
        engine,
        "SELECT count(*) FROM ledger_events WHERE type = 'usage'"
        " AND tokens_in + tokens_out > bound_tokens",
    )
    assert 1 <= over <= concurrency  # the calls already in flight when the first bill came
    assert calls(reports) <= concurrency
    assert sum(r.stats.over_bound for r in reports) == over
    assert total(reports, "deferred") >= 80 - concurrency
    # verify and the spend check show it (keys and counts, never text).
    outcome = verify(engine)
    acme = next(r for r in outcome.reports if r.tenant == "acme")
    assert acme.over_bound == over
    assert sum(p.kind == "over_bound" for p in outcome.problems) == over
    name = ["billed_within_bound"]
    bound = [
        v
        for ref in refs_for(["acme"])
        for v in check_results_for(engine, ref, VERSIONS, RUBRIC, ChecksSettings(), name)
    ]
    assert any(not v.passed and "past their reserved bound" in v.summary for v in bound)
    assert all(v.blocking for v in bound)  # the labels of such a partition are not applied
    assert sum(int(v.counts["over_bound_calls"]) for v in bound) == over
    # An operator who has looked allows them, and the check passes.
    allowed = ChecksSettings(max_over_bound_calls=over)
    assert all(
        v.passed
        for ref in refs_for(["acme"])
        for v in check_results_for(engine, ref, VERSIONS, RUBRIC, allowed, name)
    )
    # The other tenant is not affected.
    others, _ = run(engine, ["globex"])
    assert total(others, "accepted") == 80


# -- run-level errors ---------------------------------------------------------------------------


def _refusing(status: int, code: str, seen: list[str]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization", ""))
        body = {
            "error": {
                "message": "Incorrect API key provided: sk-li****4f3a. You can find your API "
                "key at https://platform.openai.com/account/api-keys.",
                "type": "invalid_request_error",
                "param": None,
                "code": code,
            }
        }
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handler)


def _answering(seen: list[str], usage_shape: str = "full") -> httpx.MockTransport:
    """An OpenAI-style server that labels everything ok and reports usage in ``usage_shape``."""

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization", ""))
        body = json.loads(request.content)
        user = body["messages"][-1]["content"]
        key = user.split("\n", 1)[0].removeprefix("correlation_id: ")
        content = json.dumps(
            {
                "schema_version": 1,
                "correlation_id": key,
                "label": "ok",
                "rule_ids": [],
                "confidence": 0.9,
            }
        )
        prompt = sum(count_tokens(m["content"]) for m in body["messages"])
        completion = count_tokens(content)
        usage: dict[str, Any] | None = {
            "full": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
            "details_null": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            },
            "completion_null": {
                "prompt_tokens": prompt,
                "completion_tokens": None,
                "total_tokens": prompt + completion,
            },
            "total_only": {"total_tokens": prompt + completion},
            "none": None,
        }[usage_shape]
        answer: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:8]}",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
        }
        if usage is not None:
            answer["usage"] = usage
        billed.append(prompt + completion)
        return httpx.Response(200, json=answer, headers={"x-request-id": uuid.uuid4().hex})

    billed: list[int] = []
    transport = httpx.MockTransport(handler)
    transport.billed = billed  # type: ignore[attr-defined]
    return transport


def _http_model(
    transport: httpx.MockTransport, api_key: str = KEY, retry_after_max_seconds: float = 900.0
) -> OpenAIHttpModel:
    return OpenAIHttpModel(
        base_url="http://provider.test/v1",
        model=VERSIONS.model,
        api_key=api_key,
        limiter=EndpointLimiter(
            LimiterConfig(HttpSettings(retry_after_max_seconds=retry_after_max_seconds))
        ),
        timeouts=HttpTimeouts(connect=1.0, read=5.0, total=5.0),
        transport=transport,
    )


def _run_http(
    engine: Engine, tenants: list[str], transport: httpx.MockTransport, concurrency: int = 8
) -> list[Any]:
    return run_partitions(
        engine,
        refs_for(tenants),
        lambda: _http_model(transport),
        VERSIONS,
        RUBRIC,
        f"test-{uuid.uuid4().hex[:8]}",
        RunOptions(run=RunSettings(concurrency=concurrency), retry=FAST_RETRY, seed=1),
    )


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (401, "invalid_api_key"),
        (403, "unsupported_country_region_territory"),
        (404, "model_not_found"),
        (429, "insufficient_quota"),
    ],
)
def test_run_level_errors_stop_the_run_and_leave_every_key_pending(
    engine: Engine, tmp_path: Path, status: int, code: str
) -> None:
    import_records(engine, tmp_path, varied_corpus(["acme", "globex"], 50))
    seen: list[str] = []
    concurrency = 8
    with pytest.raises(RunStopped) as info:
        _run_http(engine, ["acme", "globex"], _refusing(status, code, seen), concurrency)
    message = str(info.value)
    assert f"HTTP {status}" in message and "http://provider.test/v1/chat/completions" in message
    assert KEY not in message and "sk-li" not in message
    assert isinstance(info.value.__cause__, DispatchHalted)
    # At most one request per call in flight; nothing dead-lettered, nothing orphaned.
    assert 1 <= len(seen) <= concurrency
    assert count(engine, "SELECT count(*) FROM dead_letters") == 0
    assert count(engine, "SELECT count(*) FROM results") == 0
    attempts = count(engine, "SELECT count(*) FROM ledger_events WHERE type = 'attempt'")
    closed = count(engine, "SELECT count(*) FROM ledger_events WHERE type = 'error'")
    assert attempts == closed
    with engine.connect() as conn:
        stored = [m for (m,) in conn.exec_driver_sql("SELECT message FROM ledger_events")]
    assert not any(m and ("sk-li" in m or KEY in m) for m in stored)
    # The next run with a working key completes everything.
    fixed: list[str] = []
    reports = _run_http(engine, ["acme", "globex"], _answering(fixed))
    assert total(reports, "accepted") == 100 and len(fixed) == 100
    assert verify(engine).as_dict(require_complete=True)["ok"]


# -- usage shapes over HTTP ---------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["full", "details_null", "completion_null", "total_only", "none"])
def test_every_usage_shape_books_each_key_once(engine: Engine, tmp_path: Path, shape: str) -> None:
    import_records(engine, tmp_path, varied_corpus(["acme"], 40))
    seen: list[str] = []
    transport = _answering(seen, shape)
    reports = _run_http(engine, ["acme"], transport)
    assert total(reports, "accepted") == 40 and len(seen) == 40  # one billed request per key
    assert set(usage_per_key(engine).values()) == {1}
    truth = sum(transport.billed)  # type: ignore[attr-defined]
    booked = billed_by_tenant(engine)["acme"]
    expected_shape = {"total_only": "total", "none": "missing"}.get(shape, "split")
    with engine.connect() as conn:
        shapes = {
            s
            for (s,) in conn.exec_driver_sql(
                "SELECT usage_shape FROM ledger_events WHERE type = 'usage'"
            )
        }
    assert shapes == {expected_shape}
    if shape == "none":
        assert booked >= truth  # the bound, flagged, never 0
    else:
        assert booked == truth  # the ledger equals the provider's meter
    assert verify(engine).as_dict(require_complete=True)["ok"]


# -- Retry-After ----------------------------------------------------------------------------------


def test_a_bogus_retry_after_is_capped_and_reported(engine: Engine, tmp_path: Path) -> None:
    import_records(engine, tmp_path, varied_corpus(["acme"], 6))
    answered: list[str] = []
    ok = _answering(answered)
    refused: set[str] = set()

    def handler(request: httpx.Request) -> httpx.Response:
        key = json.loads(request.content)["messages"][-1]["content"][16:80]
        if key not in refused:
            refused.add(key)
            return httpx.Response(
                429,
                json={"error": {"message": "slow down", "type": "requests", "code": None}},
                headers={"retry-after": "1000000000000"},
            )
        return ok.handle_request(request)

    logs: list[str] = []
    reports = run_partitions(
        engine,
        refs_for(["acme"]),
        lambda: _http_model(httpx.MockTransport(handler), retry_after_max_seconds=0.2),
        VERSIONS,
        RUBRIC,
        "test-retry-after",
        RunOptions(
            run=RunSettings(concurrency=2),
            retry=RetryPolicy(
                max_attempts=3,
                retry_base_seconds=0,
                retry_max_seconds=0,
                retry_after_max_seconds=0.2,
            ),
            seed=1,
        ),
        log=logs.append,
    )
    assert total(reports, "accepted") == 6
    assert sum(r.stats.retry_after_capped for r in reports) == 6
    assert max(r.stats.retry_after_longest_s for r in reports) == 1e12
    assert sum("BACKFILL_RETRY_AFTER_MAX_SECONDS" in m for m in logs) == 1  # logged once


def test_limiter_pause_is_bounded() -> None:
    clock = [0.0]
    limiter = EndpointLimiter(
        LimiterConfig(HttpSettings(rpm=600, retry_after_max_seconds=900.0)), clock=lambda: clock[0]
    )
    permit = limiter.claim(limiter.reserve(10))
    assert not isinstance(permit, type(None))
    limiter.on_rate_limited(permit, 1e12)  # type: ignore[arg-type]
    snap = limiter.snapshot()
    assert snap["pauses_capped"] == 1 and snap["longest_pause_s"] == 900.0
    ticket = limiter.reserve(10)
    assert ticket.start <= 900.0 + 1.0
    assert math.isfinite(ticket.start)


def test_dry_run_shows_the_estimate_and_the_reserved_bound(
    engine: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import_records(engine, tmp_path, varied_corpus(["acme"], 20))
    env = {
        "BACKFILL_DATABASE_URL": engine.url.render_as_string(hide_password=False),
        "DAGSTER_HOME": str(tmp_path / "home"),
        "BACKFILL_MODEL": "gpt-4o-mini",
    }
    args = build_parser().parse_args(["dry-run", "--json"])
    assert args.func(args, Settings.from_env(env)) == 0
    (row,) = json.loads(capsys.readouterr().out)["tenants"]
    assert row["keys"] == 20
    # The bound is what the budget reserves: far above the estimate, never below it.
    assert row["bound_tokens"] > 2 * row["estimated_tokens"] > 0
    assert Decimal(row["bound_cost_usd"]) > Decimal(row["estimated_cost_usd"]) > 0
