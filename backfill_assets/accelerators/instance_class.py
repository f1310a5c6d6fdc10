"""The project's Dagster instance class: Dagster's own, its compute logs mirrored by a thread.

Both ``dagster.yaml`` templates name it (``instance_class``; the embedded one through
``sqlite_instance.EmbeddedInstance``, which extends it). An instance class's defaults are the
only place Dagster passes the instance's home to a component: a section in the file could
only follow ``DAGSTER_HOME`` from the environment, not the home being opened. So the compute
logs are a default here, at Dagster's own path under the home (``compute_logs.py``); a
``compute_logs:`` section in the file still replaces them. On a Dagster release other than the
one it was written for (``version.py``) the defaults are Dagster's own.

Its one setting, ``backfill_daemon: {interval_seconds: N}``, is how often the daemon's backfill
daemon looks at the backfills: Dagster's loop sleeps a constant 30 s between looks, so a
backfill launched from the UI waits up to 30 s for its first run and up to 30 s after its last
before it is closed (docs/operations.md, "Daemon settings"). The value is Dagster's module
constant, set by every process that opens the instance (the daemon does before its loops
start; only its backfill loop reads it), on the release it was written for; on any other it is
ignored.

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

    def __init__(self, *args: Any, backfill_daemon: Mapping[str, Any] | None = None, **kw: Any):
        super().__init__(*args, **kw)
        interval = (backfill_daemon or {}).get("interval_seconds")
        if interval is not None:
            set_backfill_daemon_interval(interval)

    @classmethod
    def config_schema(cls) -> dict[str, Any]:
        """``backfill_daemon.interval_seconds``: the backfill daemon's look interval."""
        return {
            "backfill_daemon": dg.Field(
                {"interval_seconds": dg.Field(dg.IntSource, is_required=False)},
                is_required=False,
                description="How often the daemon looks at backfills (Dagster: every 30 s).",
            )
        }

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


def set_backfill_daemon_interval(seconds: int) -> bool:
    """Make this process's backfill daemon look every ``seconds`` (at least 1) instead of every
    30 s; whether it did (not on another release). Takes effect for a daemon started after."""
    if seconds < 1:
        raise ValueError(f"backfill_daemon.interval_seconds must be at least 1, got {seconds}")
    if not accelerated():
        return False
    from backfill_assets.accelerators.dagster_private import daemon_controller

    daemon_controller.DEFAULT_DAEMON_INTERVAL_SECONDS = seconds
    return True
