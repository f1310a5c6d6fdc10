"""The ``settings`` resource: how a run behaves, from the groups that say so.

The other resources are their groups or hold them: ``store`` is ``StoreSettings`` (its
``engine()``), ``checks`` is ``ChecksSettings`` (bounds, drift, the apply target), ``model`` a
``ModelResource`` (``model_resources.py``). None takes run config (``sealing.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from backfill_assets.config.settings import Settings
from backfill_assets.config.variables import BatchSettings, DataSettings, HttpSettings, RunSettings
from backfill_assets.defs.model_resources import ModelResource, model_resource
from backfill_assets.dispatch.batch_options import BatchOptions
from backfill_assets.dispatch.partition_run import Lanes, RunOptions
from backfill_assets.domain.work.faults import NO_FAULTS, FaultHooks


@dataclass(frozen=True)
class RunResource:
    """How a run behaves: concurrency, budget, retries, batch mode, where imports may read.

    Not the moderation policy: that is read from ``BACKFILL_POLICY_PATH`` by the process that
    loads the definitions and closed over by the assets, never run config a UI user can set.
    """

    run: RunSettings
    batch: BatchSettings
    http: HttpSettings
    data: DataSettings

    @classmethod
    def of(cls, settings: Settings) -> RunResource:
        """The resource the settings make."""
        return cls(settings.run, settings.batch, settings.http, settings.data)

    def import_root(self) -> Path:
        """Where the ``posts`` asset may read exports (``BACKFILL_IMPORT_DIR``)."""
        return self.data.import_root()

    def batch_options(
        self, model: ModelResource | None, faults: FaultHooks = NO_FAULTS
    ) -> BatchOptions:
        """Batch mode settings with the model's endpoint (None: the run fails, explaining)."""
        b = self.batch
        return BatchOptions(
            endpoint=model.batch_endpoint() if model is not None else None,
            max_lines=b.batch_max_lines,
            max_output_bytes=b.batch_max_output_bytes,
            poll_seconds=b.batch_poll_seconds,
            max_poll_seconds=max(600.0, b.batch_poll_seconds),
            create_lookup_seconds=b.batch_create_lookup_seconds,
            at_point=faults.at_point(),
        )

    def run_options(
        self, model: ModelResource | None = None, faults: FaultHooks = NO_FAULTS
    ) -> RunOptions:
        """Options for ``run_partitions``; batch mode needs the ``model`` resource.

        ``faults`` come from the environment (``faults.py``), never from this config.
        """
        r = self.run
        return RunOptions(
            run=r,
            retry=r.retry(self.http),
            after_usage=faults.after_usage(),
            dispatch_mode=self.batch.dispatch,
            batch=self.batch_options(model, faults) if self.batch.dispatch == "batch" else None,
            lanes=model.lanes() if model is not None else Lanes(),
        )


def resources(settings: Settings) -> dict[str, object]:
    """Every resource the definitions need, each holding its groups of ``settings``."""
    return {
        "store": settings.store,
        "model": model_resource(settings),
        "settings": RunResource.of(settings),
        "checks": settings.checks,
    }
