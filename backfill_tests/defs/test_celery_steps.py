"""``BACKFILL_EXECUTOR=celery``: the executor the jobs get, the workers' app, the settings both
share, and dagster-celery left unimported otherwise. The drills run them for real
(``backfill_tests/drills/test_celery_workers.py``, ``test_celery_hosts.py``)."""

from __future__ import annotations

import subprocess
import sys

import dagster as dg
import pytest

from backfill_assets.config.settings import Settings
from backfill_assets.defs.celery_steps import celery_settings, worker_app
from backfill_assets.wiring import BACKFILL_JOB, build_definitions
from backfill_tests.cli_runs import ROOT, clean_env

BROKER = "pyamqp://backfill:s3cr3t@rabbit:5672/backfill"


def test_the_jobs_run_their_steps_on_celery_with_the_settings_broker() -> None:
    defs = build_definitions({"BACKFILL_EXECUTOR": "celery", "BACKFILL_CELERY_BROKER_URL": BROKER})
    executor = defs.resolve_job_def(BACKFILL_JOB).executor_def
    assert executor.name == "celery"
    # Configured in code: a launch has no executor config to give (nor a broker to redirect).
    assert not executor.config_schema.as_field().is_required
    # The job's snapshot, stored with every run and served by the webserver, has no broker.
    snapshot = dg.serialize_value(defs.resolve_job_def(BACKFILL_JOB).get_job_snapshot())
    assert "s3cr3t" not in snapshot and "rabbit" not in snapshot


def test_the_default_executor_stays_in_process() -> None:
    defs = build_definitions({})
    assert defs.resolve_job_def(BACKFILL_JOB).executor_def.name == "in_process"


@pytest.mark.parametrize(("dead_peer", "heartbeat"), [(3, 10), (15, 30), (60, 120)])
def test_acknowledgement_settings(dead_peer: float, heartbeat: int) -> None:
    conf = celery_settings(dead_peer)
    assert conf["task_acks_late"] and conf["task_reject_on_worker_lost"]
    assert conf["worker_prefetch_multiplier"] == 1
    # After the store has given the vanished worker's session (and its locks) up.
    assert conf["broker_heartbeat"] == heartbeat >= 2 * dead_peer
    assert conf["broker_transport_options"]["visibility_timeout"] >= 12 * 3600


def test_the_workers_app_takes_dagster_celerys_step_task_with_the_same_settings() -> None:
    app = worker_app(BROKER, 15)
    assert "execute_plan" in app.tasks
    assert app.conf.broker_url == BROKER
    assert app.conf.task_acks_late and app.conf.task_reject_on_worker_lost
    assert app.conf.worker_prefetch_multiplier == 1 and app.conf.broker_heartbeat == 30
    assert [q.name for q in app.conf.task_queues] == ["dagster"]


def test_the_broker_password_is_not_in_the_settings_repr() -> None:
    settings = Settings.from_env({"BACKFILL_CELERY_BROKER_URL": BROKER})
    assert settings.orchestration.celery_broker_url == BROKER
    assert "s3cr3t" not in repr(settings) and "s3cr3t" not in repr(settings.orchestration)


def test_dagster_celery_is_imported_only_for_the_celery_executor() -> None:
    probe = "import sys, backfill_assets.definitions; print('dagster_celery' in sys.modules)"
    for executor, imported in (("in_process", "False"), ("celery", "True")):
        done = subprocess.run(
            [sys.executable, "-c", probe],
            env=clean_env(BACKFILL_EXECUTOR=executor),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == imported
