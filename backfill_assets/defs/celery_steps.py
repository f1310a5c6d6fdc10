"""Steps on Celery workers (``BACKFILL_EXECUTOR=celery``): the executor and the workers' app.

The run's process stays where the run launcher put it and sends each step as a task to the
broker; ``bin/prod worker`` on any host takes them. Both ends build their Celery app from the
same settings below, so a worker and the runs it serves cannot disagree about acknowledgement.
``dagster_celery`` is imported only here, and only when this executor is chosen.

Why each setting (docs/operations.md, "Celery: steps on several hosts"):
- ``task_acks_late``: a task is acknowledged when its step has ended, not when a worker takes
  it, so the broker still holds a step whose worker died or was cut off, and gives it to
  another worker once the broker drops that worker's connection.
- ``task_reject_on_worker_lost``: a pool process killed under its task (OOM killer, SIGKILL)
  sends the task back to the queue instead of failing it.
- ``worker_prefetch_multiplier`` 1: a worker holds only the tasks it runs; with more, the
  steps waiting in a dead worker's prefetch would wait for the broker to notice, and a busy
  worker would hold steps an idle one could run.
- ``broker_heartbeat``: AMQP heartbeats let RabbitMQ notice a silent worker (a vanished host
  sends no FIN) and redeliver its tasks. Twice ``BACKFILL_PG_DEAD_PEER_SECONDS`` (at least
  10 s): PostgreSQL frees the vanished worker's partition locks first, so the step given to
  another worker finds its partitions free instead of failing on them as busy.
- ``worker_cancel_long_running_tasks_on_connection_loss``: a worker that lost the broker
  stops its late-acknowledged steps, whose tasks the broker gives to another worker anyway.
- ``visibility_timeout`` (Redis and SQS brokers only): how long a taken task may stay
  unacknowledged before it is handed out again; above the longest step.
"""

from __future__ import annotations

from typing import Any

import dagster as dg

# The rpc backend: results travel back to the run's process over the broker, nothing else to
# run or to reach.
BACKEND = "rpc://"
MIN_HEARTBEAT_S = 10
# Redis/SQS: a step is never handed out twice while it runs (12 h, above any partition's step).
VISIBILITY_TIMEOUT_S = 12 * 3600


def celery_settings(pg_dead_peer_s: float) -> dict[str, Any]:
    """The Celery settings of the runs' and the workers' apps (why each: the docstring)."""
    return {
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "broker_heartbeat": max(MIN_HEARTBEAT_S, round(2 * pg_dead_peer_s)),
        "broker_connection_retry_on_startup": True,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "broker_transport_options": {
            # dagster-celery's own (publish retries), and the Redis/SQS visibility timeout.
            "max_retries": 3,
            "interval_start": 0,
            "interval_step": 0.2,
            "interval_max": 0.5,
            "visibility_timeout": VISIBILITY_TIMEOUT_S,
        },
    }


def celery_executor(broker_url: str, pg_dead_peer_s: float) -> dg.ExecutorDefinition:
    """Dagster's Celery executor, its broker and settings fixed in code (no run config)."""
    from dagster_celery import celery_executor as executor

    config = {
        "broker": broker_url,
        "backend": BACKEND,
        "config_source": celery_settings(pg_dead_peer_s),
    }
    configured: dg.ExecutorDefinition = executor.configured(config, name="celery")
    return configured


def worker_app(broker_url: str, pg_dead_peer_s: float) -> Any:
    """The Celery app a worker runs: dagster-celery's step task on the executor's queue, with
    the executor's settings."""
    from dagster_celery.executor import CeleryExecutor
    from dagster_celery.make_app import make_app
    from dagster_celery.tasks import create_task

    # dagster-celery's functions carry no annotations.
    executor = CeleryExecutor.for_cli(  # type: ignore[no-untyped-call]
        broker=broker_url, backend=BACKEND, config_source=celery_settings(pg_dead_peer_s)
    )
    app = make_app(executor.app_args())  # type: ignore[no-untyped-call]
    create_task(app)  # type: ignore[no-untyped-call]
    return app
