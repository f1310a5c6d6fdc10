"""Fault injection for crash drills: read from the environment only, never Dagster config.

``BACKFILL_KILL_AFTER_USAGE=N`` SIGKILLs the process right after the commit that makes the Nth
usage event durable; ``BACKFILL_KILL_AT=<point>`` SIGKILLs a batch-mode run the first time it
reaches ``intent``, ``upload``, ``create``, ``poll``, ``fetch`` or (a deadline plan's
switch-over) ``cancel``, or (``helper``) each helper process of a ``run`` over several
processes as soon as it is forked. Both are off by default. They are deliberately not resource
config: a field in the launchpad that kills the process would be a production knob. Only tests
and drills set these variables.

The product holds no kill switch: the writer and the batch runner call the hooks built here
(``after_usage``, ``at_point``), which are None unless a drill asked for one.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass

# Where a batch-mode run may be killed, in the order a chunk passes them; and a run's helper.
KILL_POINTS = ("intent", "upload", "create", "poll", "fetch", "cancel", "helper")

# Called with the usage events committed so far, after each commit.
UsageHook = Callable[[int], None]
# Called with the name of each drill point a run reaches.
PointHook = Callable[[str], None]


def _die(why: str) -> None:
    # Said first, so a drill's log shows where the process died.
    sys.stderr.write(why + "\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True, slots=True)
class FaultHooks:
    """Where a drill kills the process (0 / "" = never; ``DrillSettings.faults`` builds it)."""

    kill_after_usage: int
    kill_at: str

    def __post_init__(self) -> None:
        if self.kill_at and self.kill_at not in KILL_POINTS:
            raise ValueError(f"kill point {self.kill_at!r}: expected one of {KILL_POINTS}")

    def after_usage(self) -> UsageHook | None:
        """The writer's hook: die right after the Nth usage event became durable."""
        n = self.kill_after_usage
        if n <= 0:
            return None

        def hook(committed: int) -> None:
            if committed >= n:
                _die(f"BACKFILL_KILL_AFTER_USAGE={n}: SIGKILL")

        return hook

    def at_point(self) -> PointHook | None:
        """The batch runner's hook: die the first time the run reaches the point."""
        point = self.kill_at
        if not point:
            return None

        def hook(reached: str) -> None:
            if reached == point:
                _die(f"BACKFILL_KILL_AT={point}: SIGKILL")

        return hook


NO_FAULTS = FaultHooks(kill_after_usage=0, kill_at="")
