"""Dagster resources: the store and the run settings (the model: ``model_resources.py``)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import Field
from sqlalchemy.engine import Engine

from backfill_assets.defs.model_resources import ModelResource
from backfill_assets.dispatch.batch_options import BatchOptions
from backfill_assets.dispatch.partition_run import Lanes, RunOptions
from backfill_assets.domain.ranges import MAX_SETTING_SECONDS, MAX_TOKENS
from backfill_assets.domain.work.faults import NO_FAULTS, FaultHooks
from backfill_assets.domain.work.keys import DEFAULT_SLICE_TARGET
from backfill_assets.domain.work.outcomes import RetryPolicy
from backfill_assets.ledger.dead_peer import DEFAULT_DEAD_PEER_SECONDS
from backfill_assets.ledger.engines import engine_for

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

    # The descriptions are the reference: docs/configuration.md is generated from them.
    concurrency: int = Field(
        default=8,
        ge=1,
        le=1024,
        description="Model calls in flight per run (1..1024). With a real provider, at least "
        "RPM/60 x p99 latency (64 for 3,000 RPM at 200 ms): the limiter, not the concurrency, "
        "should hold the rate.",
    )
    tenant_budget_tokens: int = Field(
        default=0,
        ge=0,
        le=MAX_TOKENS,
        description="Strict per-tenant token cap (0: none): billed + reserved never exceeds "
        "it; keys that do not fit are `deferred`. A tenant's own cap (`tenant set-budget TENANT "
        "--tokens N`) replaces it; dollar caps are per tenant only (`--usd`), kept in the "
        "store, never in the environment or run config.",
    )
    max_attempts: int = Field(
        default=5, ge=1, le=20, description="Attempts per key before `retry_exhausted` (1..20)."
    )
    retry_base_seconds: float = Field(
        default=0.5,
        ge=0.0,
        le=MAX_SETTING_SECONDS,
        description="Exponential back-off base, full jitter.",
    )
    retry_max_seconds: float = Field(
        default=30.0,
        ge=0.0,
        le=MAX_SETTING_SECONDS,
        description="Back-off ceiling (a provider's Retry-After wins over the back-off).",
    )
    retry_after_max_seconds: float = Field(
        default=900.0,
        gt=0.0,
        le=MAX_SETTING_SECONDS,
        description="Longest Retry-After honoured, for a key and for the endpoint's pause; a "
        "provider asking for more is waited this long, once logged, and counted "
        "(`retry_after_capped`).",
    )
    flush_ms: float = Field(
        default=100.0,
        gt=0.0,
        le=1000.0,
        description="Longest a finished call waits before its usage and outcome are committed "
        "(the group commit).",
    )
    import_dir: str = Field(
        default="",
        description="The only directory the `posts` asset reads when it is materialised from "
        "Dagster (the UI, GraphQL): its `path` config is relative to it, and a path (or a "
        "symbolic link) leading outside it fails the run. Absolute path; empty: the bundled "
        "demo export's directory. The CLI's `import PATH` is not limited by it.",
    )
    slice_target_posts: int = Field(
        default=DEFAULT_SLICE_TARGET,
        ge=0,
        le=10**9,
        description="Slices fill by volume: a tenant uses 1, 2, 4, 8 or 16 of its partitions, "
        "the fewest that keep each at or below this many posts; `import` raises a tenant's "
        "level as it grows (never lowers it). 0: always 16. Changing it changes which partition "
        "a post maps to (from the next import on), but results are keyed by content, not by "
        "partition, so nothing is re-sent or re-paid.",
    )
    dispatch: str = Field(
        default="sync",
        pattern="^(sync|batch)$",
        description="`sync` (one call per key) or `batch` (the provider's Batch API, about "
        "half price, 24 h window; needs `BACKFILL_MODEL_BACKEND=openai`).",
    )
    batch_max_lines: int = Field(
        default=50_000,
        ge=1,
        le=50_000,
        description="Requests per batch file (1..50,000; files are also split at the "
        "provider's 200 MB).",
    )
    batch_max_output_bytes: int = Field(
        default=512 * 1024 * 1024,
        ge=1024,
        le=1 << 40,
        description="The largest batch output or error file read back (streamed to an unnamed "
        "temporary file, never held whole). Past it the chunk fails, reported, and its keys "
        "stay pending.",
    )
    batch_poll_seconds: float = Field(
        default=30.0,
        gt=0.0,
        le=MAX_SETTING_SECONDS,
        description="First status poll after a create; each poll waits 1.5x longer, up to 10 "
        "minutes.",
    )
    batch_create_lookup_seconds: float = Field(
        default=600.0,
        ge=0.0,
        le=MAX_SETTING_SECONDS,
        description="After a create that got no answer: how long to look for its batch in the "
        "provider's list (which may lag) before creating it again.",
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
