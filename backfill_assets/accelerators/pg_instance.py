"""The production storage ``deploy/dagster.postgres.yaml`` names: Dagster's PostgreSQL storage,
its check evaluations batched (``pg_event_log.py``, where the why is).

``BatchingPostgresStorage`` builds ``pg_event_log.AcceleratedPostgresStorage`` on the Dagster and
dagster-postgres releases it was written for (``version.py``), and Dagster's own
``DagsterPostgresStorage`` from the same settings on any other. Light on purpose: a
``dagster.yaml`` naming it must load on any 1.13 release.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster_postgres import DagsterPostgresStorage

from backfill_assets.accelerators.version import accelerated


class BatchingPostgresStorage(DagsterPostgresStorage):
    """``storage: custom:`` in ``dagster.yaml``: Dagster's PostgreSQL storage settings; the
    accelerated storage, or Dagster's own on another release."""

    @classmethod
    def from_config_value(  # type: ignore[override]  # Dagster's own class, not ``cls``
        cls, inst_data: Any, config_value: Mapping[str, Any]
    ) -> DagsterPostgresStorage:
        """The accelerated storage, or Dagster's own on another release."""
        if not accelerated(postgres=True):
            settings: Any = config_value
            return DagsterPostgresStorage.from_config_value(inst_data, settings)
        from backfill_assets.accelerators.pg_event_log import AcceleratedPostgresStorage

        return AcceleratedPostgresStorage.from_config_value(inst_data, config_value)
