"""The code location ``workspace.yaml`` loads: its ``defs``, from this process's environment.

With the CLI's entry point, the only place that reads the environment. A bad value stops the
load with a ``SettingsError`` that names the variable.
"""

from __future__ import annotations

import os

from backfill_assets.config.settings import Settings
from backfill_assets.ledger.private_files import private_umask
from backfill_assets.wiring import (
    APPLY_JOB,
    BACKFILL_JOB,
    USAGE_JOB,
    build_definitions,
)

__all__ = ["APPLY_JOB", "BACKFILL_JOB", "USAGE_JOB", "build_definitions", "defs"]

# Dagster's processes (webserver, daemon, run workers) load this module: what they create for
# us (the store, run shards, compute logs) is readable by its owner only.
private_umask()
defs = build_definitions(Settings.from_env(os.environ))
