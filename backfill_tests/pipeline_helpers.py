"""Helpers to drive the pipeline directly (no Dagster) in tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.dispatch.pipeline import (
    PartitionRef,
    PartitionReport,
    RunOptions,
    run_partitions,
)
from backfill_assets.domain.policy.rubric import TASK_VERSION, Rubric
from backfill_assets.domain.work.keys import SLICE_COUNT, Versions
from backfill_assets.domain.work.outcomes import RetryPolicy
from backfill_assets.providers.models.base import ModelAdapter
from backfill_assets.providers.models.fake import FakeModel
from backfill_assets.runner.verify import VerifyReport, verify_store

RUBRIC = Rubric()
VERSIONS = Versions(TASK_VERSION, RUBRIC.key_version, "fake-moderator-1")
FAST_RETRY = RetryPolicy(
    max_attempts=3, retry_base_seconds=0.0, retry_max_seconds=0.0, retry_after_max_seconds=900.0
)


def varied_corpus(tenants: list[str], n: int) -> list[dict[str, str]]:
    """Posts of varied length, some multi-byte: the byte-level bounds a budget reserves
    differ from post to post."""
    return [
        {
            "tenant_id": t,
            "post_id": f"p{i:04d}",
            "text": f"{t} post {i}: "
            + ("great product, would buy again " * (1 + i % 5))
            + ("ünïcödé ✓ " * (i % 3)),
        }
        for t in tenants
        for i in range(n)
    ]


def refs_for(
    tenants: Iterable[str], slices: Iterable[int] = range(SLICE_COUNT)
) -> list[PartitionRef]:
    """All partitions of the tenants."""
    sl = list(slices)
    return [PartitionRef(key=f"s{s:02d}|{t}", tenant_id=t, slice=s) for t in tenants for s in sl]


def run(
    engine: Engine,
    tenants: Iterable[str],
    adapter: ModelAdapter | None = None,
    versions: Versions = VERSIONS,
    options: RunOptions | None = None,
    rubric: Rubric = RUBRIC,
) -> tuple[list[PartitionReport], ModelAdapter]:
    """Run every partition of ``tenants``; returns the reports and the adapter used."""
    model = adapter or FakeModel(model=versions.model)
    reports = run_partitions(
        engine,
        refs_for(tenants),
        lambda: model,
        versions,
        rubric,
        f"test-{uuid.uuid4().hex[:8]}",
        options or RunOptions(retry=FAST_RETRY, seed=1),
    )
    return reports, model


def total(reports: list[PartitionReport], outcome: str) -> int:
    """Sum of one outcome over reports."""
    return sum(r.stats.outcomes.get(outcome, 0) for r in reports)


def calls(reports: list[PartitionReport]) -> int:
    """Model calls made."""
    return sum(r.stats.calls for r in reports)


def verify(engine: Engine, versions: Versions = VERSIONS) -> VerifyReport:
    """Run the verifier."""
    return verify_store(engine, versions)


def count(engine: Engine, sql: str, **params: object) -> int:
    """A scalar count."""
    with engine.connect() as conn:
        return int(conn.execute(sa.text(sql), params).scalar_one())
