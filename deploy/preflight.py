"""``bin/prod``'s start-up check, run once before the webserver and daemon start.

Refuses (exit 2, one message) unless ``$DAGSTER_HOME/dagster.yaml`` puts run, event-log and
schedule storage on PostgreSQL and queues runs (a home first touched by another command may
hold the embedded SQLite config). Then creates or upgrades Dagster's schema and the store's,
here rather than in two processes racing at start-up; an unreachable database fails now.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import dagster as dg
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage

from backfill_assets.config.settings import Settings
from backfill_assets.ledger.engines import store_engine

# Dagster's PostgreSQL storages, or ours built on them (accelerators/pg_event_log.py).
POSTGRES_STORAGES = (PostgresRunStorage, PostgresEventLogStorage, PostgresScheduleStorage)


def main() -> int:
    """Check the instance and migrate both schemas; print what runs where."""
    home = os.environ["DAGSTER_HOME"]
    with dg.DagsterInstance.from_config(home) as instance:
        storages = (instance.run_storage, instance.event_log_storage, instance.schedule_storage)
        if not all(isinstance(s, k) for s, k in zip(storages, POSTGRES_STORAGES, strict=True)):
            found = ", ".join(type(s).__name__ for s in storages)
            _say(
                f"bin/prod: {home}/dagster.yaml does not keep runs, events and schedules in"
                f" PostgreSQL (found {found}): replace it with"
                " deploy/dagster.postgres.yaml or give it `storage: postgres:`.",
            )
            return 2
        if not isinstance(instance.run_coordinator, QueuedRunCoordinator):
            _say(
                f"bin/prod: {home}/dagster.yaml does not use the QueuedRunCoordinator:"
                " runs would start in the webserver, with no run queue or per-tenant limit.",
            )
            return 2
        instance.upgrade()
        queue = instance.get_concurrency_config().run_queue_config
        assert queue is not None  # a QueuedRunCoordinator always has one
        limits = ", ".join(_limit_text(t) for t in queue.tag_concurrency_limits)
        _say(
            f"[prod] run queue: max_concurrent_runs={queue.max_concurrent_runs};"
            f" tag limits: {limits or 'none'}",
        )
    store_engine(Settings.from_env(os.environ).store)  # applies the store's pending migrations
    return 0


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")


def _limit_text(limit: Mapping[str, Any]) -> str:
    value = limit.get("value")
    if isinstance(value, Mapping) and value.get("applyLimitPerUniqueValue"):
        return f"{limit['limit']} per {limit['key']}"
    return f"{limit['limit']} for {limit['key']}={value if value is not None else '*'}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # one line an operator can act on, not a traceback
        _say(f"bin/prod: preflight failed: {_first_line(exc)}")
        sys.exit(2)
