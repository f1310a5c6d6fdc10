"""Dagster resources: the store and the run settings (the model: ``model_resources.py``)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import Field
from sqlalchemy.engine import Engine

from backfill_assets.core.faults import NO_FAULTS, FaultHooks
from backfill_assets.core.keys import DEFAULT_SLICE_TARGET
from backfill_assets.core.outcomes import RetryPolicy
from backfill_assets.dispatch.batch_options import BatchOptions
from backfill_assets.dispatch.partition_run import Lanes, RunOptions
from backfill_assets.orchestration.engines import engine_for
from backfill_assets.orchestration.model_resources import ModelResource
from backfill_assets.store.dead_peer import DEFAULT_DEAD_PEER_SECONDS

# What the UI may import when BACKFILL_IMPORT_DIR is unset: the bundled demo export only.
DEMO_DIR = Path(__file__).resolve().parents[1] / "demo"


class StoreResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """The results/ledger store (SQLite by default, PostgreSQL in production)."""

    database_url: str = Field(description="SQLAlchemy URL; postgresql:// uses psycopg2.")
    dead_peer_seconds: float = Field(
        default=DEFAULT_DEAD_PEER_SECONDS,
        ge=2.0,
        description="PostgreSQL: give up on a silent peer (and free its locks) within this.",
    )

    def engine(self) -> Engine:
        """The migrated engine."""
        return engine_for(self.database_url, self.dead_peer_seconds)


class RunSettings(dg.ConfigurableResource):  # type: ignore[type-arg]
    """How a run behaves: concurrency, budget, retries, batch mode.

    Not the moderation policy: that is read from ``BACKFILL_POLICY_PATH`` by the process that
    loads the definitions and closed over by the assets, never run config a UI user can set.
    """

    concurrency: int = Field(default=8, ge=1, le=1024, description="Model calls in flight.")
    tenant_budget_tokens: int = Field(default=0, ge=0, description="Per-tenant cap; 0 = none.")
    max_attempts: int = Field(default=5, ge=1, le=20)
    retry_base_seconds: float = Field(default=0.5, ge=0.0)
    retry_max_seconds: float = Field(default=30.0, ge=0.0)
    retry_after_max_seconds: float = Field(
        default=900.0,
        gt=0.0,
        description="Longest Retry-After honoured; a provider asking for more waits this long.",
    )
    flush_ms: float = Field(default=100.0, gt=0.0, le=1000.0, description="Max group-commit delay.")
    import_dir: str = Field(
        default="", description="The only directory the posts asset reads (empty: the demo's)."
    )
    slice_target_posts: int = Field(
        default=DEFAULT_SLICE_TARGET,
        ge=0,
        description="Posts per partition before a tenant's partitions split (0: always 16).",
    )
    dispatch: str = Field(
        default="sync",
        pattern="^(sync|batch)$",
        description="sync (one call per key) or batch (the provider's Batch API, half price).",
    )
    batch_max_lines: int = Field(
        default=50_000, ge=1, le=50_000, description="Batch mode: requests per batch file."
    )
    batch_max_output_bytes: int = Field(
        default=512 * 1024 * 1024,
        ge=1024,
        description="Batch mode: the largest output or error file read (streamed to disk).",
    )
    batch_poll_seconds: float = Field(
        default=30.0, gt=0.0, description="Batch mode: first poll interval (grows to 10 min)."
    )
    batch_create_lookup_seconds: float = Field(
        default=600.0,
        ge=0.0,
        description="Batch mode: after a create with no answer, how long to look for its "
        "batch in the provider's list (which may lag) before creating it again.",
    )

    def import_root(self) -> Path:
        """Where the ``posts`` asset may read exports (``BACKFILL_IMPORT_DIR``)."""
        return Path(self.import_dir) if self.import_dir else DEMO_DIR

    def batch_options(
        self, model: ModelResource | None, faults: FaultHooks = NO_FAULTS
    ) -> BatchOptions:
        """Batch mode settings with the model's endpoint (None: the run fails, explaining)."""
        return BatchOptions(
            endpoint=model.batch_endpoint() if model is not None else None,
            max_lines=self.batch_max_lines,
            max_output_bytes=self.batch_max_output_bytes,
            poll_seconds=self.batch_poll_seconds,
            max_poll_seconds=max(600.0, self.batch_poll_seconds),
            create_lookup_seconds=self.batch_create_lookup_seconds,
            at_point=faults.at_point(),
        )

    def run_options(
        self, model: ModelResource | None = None, faults: FaultHooks = NO_FAULTS
    ) -> RunOptions:
        """Options for ``run_partitions``; batch mode needs the ``model`` resource.

        ``faults`` come from the environment (``faults.py``), never from this config.
        """
        return RunOptions(
            concurrency=self.concurrency,
            budget_tokens=self.tenant_budget_tokens or None,
            after_usage=faults.after_usage(),
            flush_interval_s=self.flush_ms / 1000.0,
            retry=RetryPolicy(
                max_attempts=self.max_attempts,
                base_delay_s=self.retry_base_seconds,
                max_delay_s=self.retry_max_seconds,
                max_retry_after_s=self.retry_after_max_seconds,
            ),
            dispatch_mode=self.dispatch,
            batch=self.batch_options(model, faults) if self.dispatch == "batch" else None,
            lanes=model.lanes() if model is not None else Lanes(),
        )
