"""Fixtures for the HTTP provider path: simulators on loopback and adapters bound to them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from backfill_assets.config.variables import HttpSettings
from backfill_assets.dispatch.partition_run import PartitionReport
from backfill_assets.dispatch.pipeline import RunOptions, run_partitions
from backfill_assets.domain.policy.rubric import TASK_VERSION, Rubric
from backfill_assets.domain.work.keys import Versions
from backfill_assets.providers.models.base import ModelRequest, ModelResponse
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.providers.models.timeouts import HttpTimeouts
from backfill_assets.providers.ratelimit import EndpointLimiter, LimiterConfig, LimiterRegistry
from backfill_assets.providersim import Simulator
from backfill_tests.conftest import StartSim as StartSim  # re-exported for the tests
from backfill_tests.pipeline_helpers import refs_for

MODEL = "gpt-4o-mini"
RUBRIC = Rubric()
VERSIONS = Versions(TASK_VERSION, RUBRIC.key_version, MODEL)
API_KEY = "sk-test-9f2c1e7a4b3d6e8f0a1b2c3d"


@dataclass
class Call:
    """One ``complete`` as the adapter saw it (monotonic times)."""

    key: str
    attempt: int
    sent: float
    done: float
    status: int | None


class RecordingModel(OpenAIHttpModel):
    """The real HTTP adapter, noting when each attempt went out and how it ended."""

    def __init__(self, calls: list[Call], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls = calls

    async def complete(self, request: ModelRequest) -> ModelResponse:
        sent = time.monotonic()
        try:
            response = await super().complete(request)
        except Exception as exc:
            status = getattr(exc, "status", None)
            self.calls.append(Call(request.key, request.attempt, sent, time.monotonic(), status))
            raise
        self.calls.append(Call(request.key, request.attempt, sent, time.monotonic(), 200))
        return response


AdapterFactory = Callable[..., Callable[[], OpenAIHttpModel]]


@pytest.fixture
def adapter_for() -> AdapterFactory:
    """``adapter_for(sim, rpm=.., total_timeout=.., calls=[...], **OpenAIHttpModel kwargs)`` -> a
    ``make_adapter`` callable.

    Each test gets its own limiter registry, so limiters never leak between tests; all the
    adapters one factory makes share one limiter, as runs in one process do.
    """
    registry = LimiterRegistry()

    def factory(
        sim: Simulator,
        *,
        api_key: str = "",
        rpm: int = 0,
        tpm: int = 0,
        adaptive: bool = True,
        trust_limit_headers: bool = True,
        total_timeout: float = 10.0,
        calls: list[Call] | None = None,
        retry_after_max_seconds: float = 900.0,
        **adapter: Any,
    ) -> Callable[[], OpenAIHttpModel]:
        config = LimiterConfig(
            HttpSettings(
                rpm=rpm,
                tpm=tpm,
                adaptive=adaptive,
                trust_limit_headers=trust_limit_headers,
                retry_after_max_seconds=retry_after_max_seconds,
            )
        )
        limiter = registry.get(f"{sim.base_url}#{MODEL}", config)
        kwargs: dict[str, Any] = {
            "base_url": sim.base_url,
            "model": MODEL,
            "api_key": api_key,
            "limiter": limiter,
            "timeouts": HttpTimeouts(connect=2.0, read=total_timeout, total=total_timeout),
            **adapter,
        }
        if calls is not None:
            return lambda: RecordingModel(calls, **kwargs)
        return lambda: OpenAIHttpModel(**kwargs)

    return factory


def run_over_http(
    engine: Engine,
    sim: Simulator,
    tenants: list[str],
    *,
    versions: Versions = VERSIONS,
    limiter: EndpointLimiter | None = None,
    options: RunOptions | None = None,
    **adapter: Any,
) -> list[PartitionReport]:
    """Every partition of ``tenants`` through the real HTTP adapter against ``sim`` (one limiter
    for all its adapters; ``adapter``: more ``OpenAIHttpModel`` arguments such as ``tier``)."""
    shared = limiter or EndpointLimiter(LimiterConfig())

    def make() -> OpenAIHttpModel:
        return OpenAIHttpModel(
            base_url=sim.base_url, model=versions.model, limiter=shared, **adapter
        )

    return run_partitions(
        engine,
        refs_for(tenants),
        make,
        versions,
        RUBRIC,
        f"http-{uuid.uuid4().hex[:6]}",
        options or RunOptions(seed=1),
    )
