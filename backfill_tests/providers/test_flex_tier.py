"""OpenAI's flex tier: asked for per request, booked at the tier the answer reports and at its
price (the simulator's own meter is the bill), and its "resource unavailable" answers are a
provider pause: retried without counting the attempt, never dead-lettered, never a rate cut."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.config.variables import HttpSettings, ModelSettings, RunSettings
from backfill_assets.dispatch.partition_run import PartitionReport
from backfill_assets.dispatch.pipeline import RunOptions
from backfill_assets.domain.money.prices import PriceTable, Tier, tier_served
from backfill_assets.domain.work.outcomes import RetryPolicy
from backfill_assets.providers.models.errors import Scope, classify
from backfill_assets.providers.models.openai_wire import error_code, parse_completion
from backfill_assets.providers.ratelimit import EndpointLimiter, LimiterConfig
from backfill_assets.providersim import Simulator
from backfill_tests.conftest import import_records
from backfill_tests.providers.conftest import MODEL, StartSim, run_over_http

POSTS = 40
# Two attempts: if a capacity pause counted as one, most keys would be dead-lettered.
FEW_ATTEMPTS = RetryPolicy(
    max_attempts=2, retry_base_seconds=0.01, retry_max_seconds=0.05, retry_after_max_seconds=900.0
)


def _import(engine: Engine, tmp_path: Path) -> None:
    import_records(
        engine,
        tmp_path,
        [{"tenant_id": "acme", "post_id": f"p{i}", "text": f"post {i} hi"} for i in range(POSTS)],
    )


def _run(
    engine: Engine, sim: Simulator, limiter: EndpointLimiter, **adapter: Any
) -> list[PartitionReport]:
    options = RunOptions(run=RunSettings(concurrency=16), seed=3, retry=FEW_ATTEMPTS)
    return run_over_http(engine, sim, ["acme"], limiter=limiter, options=options, **adapter)


def _scalar(engine: Engine, sql: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.text(sql)).scalar_one()


def _usage(engine: Engine) -> list[sa.Row[Any]]:
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT service_tier, price_booked, cost_nanos FROM ledger_events"
                " WHERE type = 'usage'"
            )
        ).all()


@pytest.mark.parametrize(
    ("status", "code", "message", "scope"),
    [
        (429, "resource_unavailable", "", Scope.CAPACITY),
        (429, None, "Resource Unavailable: try again later", Scope.CAPACITY),
        (498, "capacity_exceeded", "", Scope.CAPACITY),  # Groq's flex
        (498, None, "", Scope.CAPACITY),
        (429, "rate_limit_exceeded", "Rate limit reached", Scope.RETRY),
        (429, None, "Rate limit reached for requests", Scope.RETRY),
        (429, "insufficient_quota", "resource unavailable", Scope.RUN),
    ],
)
def test_capacity_answers_are_their_own_scope(
    status: int, code: str | None, message: str, scope: Scope
) -> None:
    assert classify(status, code, message) is scope


def test_the_booked_tier_is_the_one_the_answer_reports() -> None:
    body: dict[str, Any] = {"choices": [{"message": {"content": "{}"}}]}
    for reported, tier in [("flex", Tier.FLEX), ("default", Tier.STANDARD), (None, Tier.STANDARD)]:
        completion = parse_completion(json.dumps({**body, "service_tier": reported}).encode())
        assert completion.served_tier is tier is tier_served(reported)


def test_flex_is_half_of_standard_unless_priced() -> None:
    table = PriceTable.from_json("")
    assert table.cost(MODEL, 10_000, 1_000, tier=Tier.FLEX) * 2 == table.cost(MODEL, 10_000, 1_000)
    own = PriceTable.from_json(
        '{"m": [{"standard": {"input": 1, "output": 2}, "flex": {"input": 0.3, "output": 0.7}}]}'
    )
    assert own.cost("m", 1_000_000, 1_000_000, tier=Tier.FLEX) == 1_000_000_000


def test_flex_unavailability_is_a_pause_not_a_failure(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    _import(engine, tmp_path)
    sim = start_sim(flex_unavailable_share=0.6)
    limiter = EndpointLimiter(LimiterConfig(HttpSettings(rpm=60_000)))
    reports = _run(engine, sim, limiter, tier=Tier.FLEX)

    meter = sim.meter.snapshot()
    assert meter.responses_by_status.get(429, 0) > POSTS // 2  # flex said no, often
    assert _scalar(engine, "SELECT count(*) FROM dead_letters") == 0
    assert _scalar(engine, "SELECT count(*) FROM results") == POSTS
    # Not a rate signal: no cut, no pause, the whole limit still in force.
    snap = limiter.snapshot()
    assert snap["rate_limited"] == 0 and snap["cuts"] == 0 and snap["share"] == 1.0
    assert snap["capacity_unavailable"] == meter.responses_by_status[429]
    waits = sum(r.stats.capacity_waits for r in reports)
    assert waits == meter.responses_by_status[429]
    assert sum(r.stats.rate_limited for r in reports) == 0
    # Billed at flex, booked at flex, at the simulator's own price to the nano-dollar.
    assert {c.service_tier for c in meter.billed.values()} == {"flex"}
    usage = _usage(engine)
    assert len(usage) == POSTS and {r.service_tier for r in usage} == {"flex"}
    assert sum(r.cost_nanos for r in usage) == meter.billed_cost_nanos > 0
    booked = json.loads(usage[0].price_booked)
    assert booked["tier"] == "flex" and booked["input"] == "0.075"  # half of 0.15
    summary = next(r for r in reports if r.stats.calls).summary()
    assert set(summary["service_tiers"]) == {"flex"} and summary["capacity_waits"] > 0


def test_flex_falls_back_to_standard_after_a_stretch_of_unavailability(
    engine: Engine, tmp_path: Path, start_sim: StartSim, caplog: pytest.LogCaptureFixture
) -> None:
    _import(engine, tmp_path)
    sim = start_sim(flex_unavailable_share=1.0)  # flex is down
    limiter = EndpointLimiter(LimiterConfig())
    reports = _run(
        engine,
        sim,
        limiter,
        tier=Tier.FLEX,
        settings=ModelSettings(flex_fallback="standard", flex_fallback_after_s=0.3),
    )
    assert _scalar(engine, "SELECT count(*) FROM results") == POSTS
    assert _scalar(engine, "SELECT count(*) FROM dead_letters") == 0
    meter = sim.meter.snapshot()
    assert {c.service_tier for c in meter.billed.values()} == {"default"}
    usage = _usage(engine)
    assert {r.service_tier for r in usage} == {"standard"}
    assert sum(r.cost_nanos for r in usage) == meter.billed_cost_nanos
    assert "sent at the standard tier" in caplog.text
    assert sum(r.stats.service_tiers["standard"] for r in reports) == POSTS


def test_a_standard_run_sends_no_tier_and_books_standard(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    _import(engine, tmp_path)
    sim = start_sim(flex_unavailable_share=1.0)  # only flex requests are refused
    _run(engine, sim, EndpointLimiter(LimiterConfig()))
    meter = sim.meter.snapshot()
    assert 429 not in meter.responses_by_status
    assert {r.service_tier for r in _usage(engine)} == {"standard"}
    assert sum(r.cost_nanos for r in _usage(engine)) == meter.billed_cost_nanos


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"error": {"code": "resource_unavailable"}}, "resource_unavailable"),
        ({"error": {"code": 1234}}, "1234"),  # some gateways send numbers
        ({"error": {"code": "x" * 500}}, "x" * 60),
        ({"error": {"code": True}}, None),
        ({"error": {"code": ""}}, None),
        ({"error": "flat string"}, None),
        (["not", "an", "object"], None),
        (None, None),
    ],
)
def test_one_error_code_reader_for_sync_and_batch(body: object, code: str | None) -> None:
    assert error_code(body) == code
