"""Dagster resources: the store, the model adapters and the run settings."""

from __future__ import annotations

import threading
from pathlib import Path

import dagster as dg
from pydantic import Field
from sqlalchemy.engine import Engine

from .keys import Versions
from .models.base import ModelAdapter
from .models.fake import FakeModel
from .outcomes import RetryPolicy
from .pipeline import RunOptions
from .rubric import TASK_VERSION, Rubric
from .store.engine import make_engine
from .store.migrate import migrate

_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def engine_for(url: str) -> Engine:
    """One migrated engine per URL per process."""
    with _engines_lock:
        engine = _engines.get(url)
        if engine is None:
            engine = make_engine(url)
            migrate(engine)
            _engines[url] = engine
        return engine


class StoreResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """The results/ledger store (SQLite by default, PostgreSQL in production)."""

    database_url: str = Field(description="SQLAlchemy URL; postgresql:// uses psycopg2.")

    def engine(self) -> Engine:
        """The migrated engine."""
        return engine_for(self.database_url)


class ModelResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Base of the model adapters: builds a fresh adapter for each run's event loop."""

    model: str = Field(description="Model name; part of every key and of the code version.")

    def build_adapter(self) -> ModelAdapter:
        """A new adapter bound to the caller's event loop."""
        raise NotImplementedError


class FakeModelResource(ModelResource):
    """Deterministic in-process model for demos and tests."""

    model: str = "fake-moderator-1"
    latency_ms: float = Field(default=0.0, description="Added latency per call.")
    failure_rate: float = Field(default=0.0, description="Share of calls failing (retriable).")
    malformed_rate: float = Field(default=0.0, description="Share of keys answered malformed.")

    def build_adapter(self) -> ModelAdapter:
        """A fake model."""
        return FakeModel(
            model=self.model,
            latency_ms=self.latency_ms,
            failure_rate=self.failure_rate,
            malformed_rate=self.malformed_rate,
        )


class BackfillSettings(dg.ConfigurableResource):  # type: ignore[type-arg]
    """How a run behaves: concurrency, budget, retries, prompt, fault injection."""

    concurrency: int = Field(default=8, ge=1, le=1024, description="Model calls in flight.")
    tenant_budget_tokens: int = Field(default=0, ge=0, description="Per-tenant cap; 0 = none.")
    kill_after_usage: int = Field(
        default=0, ge=0, description="Fault injection: SIGKILL after N usage events (0 = off)."
    )
    max_attempts: int = Field(default=5, ge=1, le=20)
    retry_base_seconds: float = Field(default=0.5, ge=0.0)
    retry_max_seconds: float = Field(default=30.0, ge=0.0)
    flush_ms: float = Field(default=100.0, gt=0.0, le=1000.0, description="Max group-commit delay.")
    prompt_path: str = Field(default="", description="File with a custom system prompt.")

    def rubric(self) -> Rubric:
        """The rubric in force (a custom prompt file changes the prompt version)."""
        if self.prompt_path:
            return Rubric(system_prompt=Path(self.prompt_path).read_text("utf-8"))
        return Rubric()

    def run_options(self) -> RunOptions:
        """Options for ``run_partitions``."""
        return RunOptions(
            concurrency=self.concurrency,
            budget_tokens=self.tenant_budget_tokens or None,
            kill_after_usage=self.kill_after_usage or None,
            flush_interval_s=self.flush_ms / 1000.0,
            retry=RetryPolicy(
                max_attempts=self.max_attempts,
                base_delay_s=self.retry_base_seconds,
                max_delay_s=self.retry_max_seconds,
            ),
        )


def versions_for(settings: BackfillSettings, model: ModelResource) -> Versions:
    """Task, prompt and model versions that name this run's work."""
    return Versions(TASK_VERSION, settings.rubric().prompt_version, model.model)
