"""A step's check evaluations, held back to be written with the step's next event.

Dagster 1.13 stores each check evaluation on its own (they are not batchable), and a check
step over a run of 500 partitions yields 500 of them in a row, then its outputs. Both
instance event logs (``sqlite_event_log.py``, ``pg_event_log.py``) hold a step's evaluations here
and write them with the next event, or at ``HELD_MAX``, in one go. An evaluation shows in the
UI when its step yields the next event, at the latest when the step ends; one reported outside
a step (the UI, a sensor) is written at once, since no next event of its step is coming. A
process killed before that next event loses them with the step, whose rerun evaluates again.
"""

from __future__ import annotations

import threading

import dagster as dg

# Evaluations held at most: a check step's whole run of 500 partitions (one evaluation each)
# twice over.
HELD_MAX = 1000


class HeldChecks:
    """The evaluations an event log holds back, and the lock its writes take (reentrant:
    Dagster's default ``store_event_batch`` calls ``store_event``)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._events: list[dg.EventLogEntry] = []

    def hold(self, event: dg.EventLogEntry) -> bool:
        """Hold ``event`` if it is a step's check evaluation (call with ``lock`` held)."""
        dagster_event = event.dagster_event
        if (
            dagster_event is None
            or dagster_event.event_type != dg.DagsterEventType.ASSET_CHECK_EVALUATION
            or dagster_event.step_key is None
        ):
            return False
        self._events.append(event)
        return True

    @property
    def full(self) -> bool:
        """``HELD_MAX`` are held: time to write them."""
        return len(self._events) >= HELD_MAX

    def take(self) -> list[dg.EventLogEntry]:
        """The held evaluations, in the order they came; none held afterwards."""
        events, self._events = self._events, []
        return events
