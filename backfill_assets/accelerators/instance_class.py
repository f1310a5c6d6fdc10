"""The project's Dagster instance class: Dagster's own, its compute logs mirrored by a thread.

Both ``dagster.yaml`` templates name it (``instance_class``; the embedded one through
``sqlite_instance.EmbeddedInstance``, which extends it). An instance class's defaults are the
only place Dagster passes the instance's home to a component: a section in the file could
only follow ``DAGSTER_HOME`` from the environment, not the home being opened. So the compute
logs are a default here, at Dagster's own path under the home (``compute_logs.py``); a
``compute_logs:`` section in the file still replaces them. On a Dagster release other than the
one it was written for (``version.py``) the defaults are Dagster's own.

This module imports no private Dagster name at import time: a ``dagster.yaml`` naming it must
load on any 1.13 release. The accelerated classes are imported when they are used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg
import yaml

from backfill_assets.accelerators.version import accelerated


class BackfillInstance(dg.DagsterInstance):
    """A Dagster instance whose compute logs default to ``MirroredComputeLogManager``;
    everything else is Dagster's (or the file's)."""

    @classmethod
    def config_schema(cls) -> dict[str, Any]:
        """No settings of its own."""
        return {}

    @classmethod
    def config_defaults(cls, base_dir: str) -> Mapping[str, Any]:
        """Dagster's defaults for ``base_dir``, the compute logs mirrored by a thread."""
        from backfill_assets.accelerators.dagster_private import InstanceRef

        defaults = dict(InstanceRef.config_defaults(base_dir))
        if not accelerated():
            return defaults
        from backfill_assets.accelerators.compute_logs import MirroredComputeLogManager
        from backfill_assets.accelerators.dagster_private import compute_logs_directory

        defaults["compute_logs"] = class_data(
            MirroredComputeLogManager, compute_logs_directory(base_dir)
        )
        return defaults


def class_data(cls: type, base_dir: str) -> Any:
    """A default component: ``cls`` configured with ``base_dir`` (a ``ConfigurableClassData``)."""
    from backfill_assets.accelerators.dagster_private import ConfigurableClassData

    return ConfigurableClassData(
        cls.__module__, cls.__name__, yaml.dump({"base_dir": base_dir}, default_flow_style=False)
    )
