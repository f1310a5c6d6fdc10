"""Dagster definitions; the only module (with the CLI) that reads the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping

import dagster as dg

from .assets import build_moderation_labels, posts
from .partitions import moderation_partitions
from .sensors import tenant_partitions_sensor
from .settings import partitions_per_run, resources_from_env, versions_from_env

BACKFILL_JOB = "moderation_backfill"


def build_definitions(env: Mapping[str, str]) -> dg.Definitions:
    """Definitions wired from an environment mapping."""
    labels = build_moderation_labels(versions_from_env(env).code_version, partitions_per_run(env))
    backfill_job = dg.define_asset_job(
        BACKFILL_JOB,
        selection=dg.AssetSelection.assets(labels),
        partitions_def=moderation_partitions,
        description="Materialise moderation labels for tenant x slice partitions.",
    )
    return dg.Definitions(
        assets=[posts, labels],
        jobs=[backfill_job],
        sensors=[tenant_partitions_sensor],
        resources=resources_from_env(env),
        # One process per run: partitions are batched into runs, so per-step subprocesses
        # would only add start-up cost (see README, "Execution").
        executor=dg.in_process_executor,
    )


defs = build_definitions(os.environ)
