"""Fault injection for crash drills: read from the environment only, never Dagster config.

``BACKFILL_KILL_AFTER_USAGE=N`` SIGKILLs the process right after the commit that makes the Nth
usage event durable; ``BACKFILL_KILL_AT=<point>`` SIGKILLs a batch-mode run the first time it
reaches ``intent``, ``upload``, ``create``, ``poll`` or ``fetch``. Both are off by default.
They are deliberately not resource config: a field in the launchpad that kills the process
would be a production knob. Only tests and drills set these variables.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FaultHooks:
    """Where a drill kills the process (0 / "" = never)."""

    kill_after_usage: int = 0
    kill_at: str = ""


NO_FAULTS = FaultHooks()
