"""Fixtures for batch mode: simulators with the Batch API and runs against them."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.config.variables import RunSettings
from backfill_assets.dispatch.batch_options import BatchOptions
from backfill_assets.dispatch.pipeline import PartitionReport, RunOptions, run_partitions
from backfill_assets.domain.policy.rubric import TASK_VERSION, Rubric
from backfill_assets.domain.work.keys import Versions, content_hash, work_key
from backfill_assets.domain.work.outcomes import RetryPolicy
from backfill_assets.providers.batch_client import BatchEndpoint
from backfill_assets.providersim import Simulator
from backfill_tests.conftest import StartSim as StartSim  # re-exported for the tests
from backfill_tests.pipeline_helpers import refs_for

MODEL = "gpt-4o-mini"
RUBRIC = Rubric()
VERSIONS = Versions(TASK_VERSION, RUBRIC.key_version, MODEL)
API_KEY = "sk-batch-test-5e1d9c0b7a4f3e2d1c0b"
RETRY = RetryPolicy(
    max_attempts=3, retry_base_seconds=0.0, retry_max_seconds=0.0, retry_after_max_seconds=900.0
)
# Milliseconds, not the hours of a real provider: every state is still visited.
FAST_SIM: dict[str, Any] = {
    "batch_validating_ms": 2,
    "batch_processing_ms": 15,
    "batch_finalizing_ms": 2,
}


@pytest.fixture
def sim_defaults() -> dict[str, Any]:
    """Fast batch timings and the API key, unless a test overrides them."""
    return {**FAST_SIM, "api_key": API_KEY}


def records(tenants: list[str], n: int) -> list[dict[str, str]]:
    """Distinct, recognisable texts (a leak would be unmistakable)."""
    return [
        {"tenant_id": t, "post_id": f"p{i:03d}", "text": f"{t} marker-{i:03d}: shipped it today"}
        for t in tenants
        for i in range(n)
    ]


def key_of(record: dict[str, str]) -> str:
    """The work key of an imported record."""
    return work_key(VERSIONS, record["tenant_id"], record["post_id"], content_hash(record["text"]))


def batch_options(sim: Simulator, *, budget: int | None = None, **batch: Any) -> RunOptions:
    """Run options selecting batch mode against ``sim``."""
    endpoint = BatchEndpoint(sim.base_url, MODEL, api_key=API_KEY)
    return RunOptions(
        run=RunSettings(tenant_budget_tokens=budget or 0),
        dispatch_mode="batch",
        retry=RETRY,
        batch=BatchOptions(endpoint=endpoint, **{"poll_seconds": 0.005, **batch}),
    )


def run_batch(
    engine: Engine,
    tenants: list[str],
    options: RunOptions,
    log: Callable[[str], None] = lambda _m: None,
) -> list[PartitionReport]:
    """Every partition of ``tenants`` in one batch-mode run."""
    return run_partitions(
        engine,
        refs_for(tenants),
        lambda: pytest.fail("batch mode must not build the sync adapter"),
        VERSIONS,
        RUBRIC,
        f"batch-{uuid.uuid4().hex[:8]}",
        options,
        log,
    )


def rows(engine: Engine, sql: str, **params: Any) -> list[Any]:
    """All rows of a query."""
    with engine.connect() as conn:
        return list(conn.execute(sa.text(sql), params).all())
