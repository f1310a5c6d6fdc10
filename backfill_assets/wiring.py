"""The Dagster definitions, wired from one ``Settings`` object (no environment read here)."""

from __future__ import annotations

from collections.abc import Mapping

import dagster as dg

from backfill_assets.config.settings import Settings
from backfill_assets.defs.labels.applied import build_applied_labels
from backfill_assets.defs.labels.assets import build_moderation_labels
from backfill_assets.defs.labels.checks import build_partition_checks
from backfill_assets.defs.posts.assets import build_incremental_schedule, build_posts
from backfill_assets.defs.reporting.backfill_plan import build_backfill_plan
from backfill_assets.defs.reporting.evaluation import build_policy_evaluation
from backfill_assets.defs.reporting.review_queue import build_review_queue
from backfill_assets.defs.reporting.usage import tenant_usage
from backfill_assets.defs.resources import resources
from backfill_assets.defs.sealing import sealed_resources
from backfill_assets.defs.sensors import reporting_automation, tenant_partitions_sensor
from backfill_assets.platform_db.sink import sink_of
from backfill_assets.platform_db.sql_import import source_of

BACKFILL_JOB = "moderation_backfill"
APPLY_JOB = "apply_labels"
USAGE_JOB = "refresh_usage"
PLAN_JOB = "refresh_backfill_plan"


def build_definitions(settings: Settings | Mapping[str, str]) -> dg.Definitions:
    """Definitions wired from the settings (tests may hand in a plain variable mapping)."""
    if not isinstance(settings, Settings):
        settings = Settings.from_env(settings)
    # The code location's runs send and book: its model needs a price.
    settings.require_price()
    per_run = settings.orchestration.partitions_per_run
    source = source_of(settings.data)
    posts = build_posts(source)
    import_job, incremental = build_incremental_schedule(
        posts, source, settings.data.source_schedule
    )
    # The policy is read once, here, from the environment of the process that loads the code,
    # and closed over by every asset that needs it: no run config can change it.
    rubric = settings.rubric()
    code_version = settings.versions().code_version
    labels = build_moderation_labels(
        rubric, code_version, per_run, settings.drills.faults(), settings.policy_gate()
    )
    applied = build_applied_labels(rubric, per_run, sink_of(settings.data))
    checks = build_partition_checks(rubric)
    backfill_plan = build_backfill_plan(rubric)
    evaluation = build_policy_evaluation(rubric, settings.policy_gate())
    review_queue = build_review_queue(rubric)
    backfill_job = dg.define_asset_job(
        BACKFILL_JOB,
        # Selecting the assets selects their checks too: labels, the nine checks, then the
        # apply, which the blocking checks gate within each run.
        selection=dg.AssetSelection.assets(labels, applied),
        description="Moderation labels, their checks and the gated apply, per tenant slice.",
    )
    apply_job = dg.define_asset_job(
        APPLY_JOB,
        selection=dg.AssetSelection.assets(applied),
        description="Apply verified labels only (re-checks the blocking checks itself).",
    )
    usage_job = dg.define_asset_job(
        USAGE_JOB,
        selection=dg.AssetSelection.assets(tenant_usage),
        description="Refresh tenant_usage from the ledger (run by `backfill-moderation run`).",
    )
    plan_job = dg.define_asset_job(
        PLAN_JOB,
        selection=dg.AssetSelection.assets(backfill_plan),
        description="Refresh backfill_plan (run by `backfill-moderation run --deadline` as it "
        "goes, so the UI shows the deadline plan's progress).",
    )
    return dg.Definitions(
        assets=[posts, labels, applied, tenant_usage, backfill_plan, evaluation, review_queue],
        asset_checks=[checks],
        jobs=[backfill_job, apply_job, usage_job, plan_job, import_job],
        schedules=[incremental],
        sensors=[tenant_partitions_sensor, reporting_automation],
        # Sealed: no resource takes run config, so a launch cannot redirect the model, the
        # keys or the store (sealing.py); their values are this process's environment.
        resources=sealed_resources(resources(settings)),
        # One process per run: partitions are batched into runs, so per-step subprocesses
        # would only add start-up cost (docs/architecture.md, "One run, many partitions").
        # BACKFILL_EXECUTOR=multiprocess restores Dagster's default (the orchestration
        # benchmark compares the two).
        executor=_executor(settings),
    )


def _executor(settings: Settings) -> dg.ExecutorDefinition:
    """The executor ``BACKFILL_EXECUTOR`` names; dagster-celery is imported only for Celery."""
    chosen = settings.orchestration.executor
    if chosen == "celery":
        from backfill_assets.defs.celery_steps import celery_executor

        return celery_executor(
            settings.orchestration.celery_broker_url, settings.store.pg_dead_peer_seconds
        )
    return dg.multiprocess_executor if chosen == "multiprocess" else dg.in_process_executor
