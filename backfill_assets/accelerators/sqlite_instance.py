"""The embedded instance ``dagster.yaml`` names: the project's, its SQLite event log pooled.

``EmbeddedInstance`` is the project's instance (``instance_class.py``) whose default storage is
Dagster's SQLite storage with an event log that keeps its shards' connections open
(``sqlite_event_log.py``, where the why is). On a Dagster release other than the one it was
written for (``version.py``) its defaults are Dagster's own. Light on purpose: a
``dagster.yaml`` naming it must load on any 1.13 release.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backfill_assets.accelerators.instance_class import BackfillInstance, class_data
from backfill_assets.accelerators.version import accelerated


class EmbeddedInstance(BackfillInstance):
    """The project's instance whose default storage is ``PooledSqliteStorage``
    (``dagster.yaml``: ``instance_class``)."""

    @classmethod
    def config_defaults(cls, base_dir: str) -> Mapping[str, Any]:
        """The project's defaults for ``base_dir``, the storage replaced by the pooled one."""
        defaults = dict(super().config_defaults(base_dir))
        if not accelerated():
            return defaults
        from backfill_assets.accelerators.dagster_private import event_logs_directory
        from backfill_assets.accelerators.sqlite_event_log import (
            PooledSqliteEventLogStorage,
            PooledSqliteStorage,
        )

        defaults["storage"] = class_data(PooledSqliteStorage, base_dir)
        defaults["event_log_storage"] = class_data(
            PooledSqliteEventLogStorage, event_logs_directory(base_dir)
        )
        return defaults
