"""Materialise partitions in-process through Dagster: a few runs, not one per partition."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import dagster as dg

from backfill_assets.defs.asset_keys import POSTS
from backfill_assets.defs.partitions import (
    listed_once,
    partition_key_for,
    partition_keys,
    register,
    tenant_of,
)
from backfill_assets.domain.checks.catalog import BLOCKING_CHECKS
from backfill_assets.domain.work.regions import run_tags as region_tags
from backfill_assets.ledger.run.posts import ImportSummary
from backfill_assets.runner.pooling import Box
from backfill_assets.runner.run_records import RunRecord, record_of

# The tags that make one run cover a range of partitions.
RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"


def record_import(instance: dg.DagsterInstance, source: str, summary: ImportSummary) -> None:
    """Record an import from the CLI as a materialisation of ``posts``.

    The posts asset is what the labels depend on; without a materialisation the UI warns on
    "Materialize all" that it was never materialised, and assets that follow imports
    (``backfill_plan``) have nothing to follow.
    """
    counts = summary.as_dict()
    metadata: dict[str, dg.MetadataValue[Any]] = {
        k: dg.MetadataValue.int(int(str(counts[k])))
        for k in ("read", "imported", "updated", "unchanged", "rejected")
    }
    metadata["source"] = dg.MetadataValue.path(source)
    metadata["new_tenants"] = dg.MetadataValue.int(len(summary.new_tenants))
    instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=POSTS, metadata=metadata))


def refresh(defs: dg.Definitions, instance: dg.DagsterInstance, job_name: str) -> bool:
    """Run a reporting job (tenant_usage, backfill_plan) in-process; True if it succeeded."""
    result = defs.resolve_job_def(job_name).execute_in_process(
        instance=instance,
        run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
        raise_on_error=False,
    )
    return bool(result.success)


# Dagster writes one "planned" event per partition and asset at run start unless told to write
# one per asset with the partition subset: a run over 100 partitions then starts with 2 events
# instead of 200 (each a commit). The price: a failed run's partitions show as missing, not
# failed, in the UI; the CLI reports the failure and its next ``run`` plans them again.
_PLANNED_SUBSET = "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS"
# On PostgreSQL, Dagster writes a step's materialisations in batches of this many rows instead
# of one commit each (half the run of many small partitions: docs/benchmarks.md). The price: a
# process killed mid-step loses that step's unwritten events (not the store's work), and the
# next ``run`` plans the partitions again. An operator's own value is kept.
_EVENT_BATCH = "DAGSTER_EVENT_BATCH_SIZE"
_EVENT_BATCH_DEFAULT = "1000"


@contextlib.contextmanager
def fewer_event_writes() -> Iterator[None]:
    """For in-process runs started here: one planned event per asset, not per partition, and
    materialisations written in batches (unless the operator set a batch size)."""
    saved = {name: os.environ.get(name) for name in (_PLANNED_SUBSET, _EVENT_BATCH)}
    os.environ[_PLANNED_SUBSET] = "1"
    os.environ.setdefault(_EVENT_BATCH, _EVENT_BATCH_DEFAULT)
    try:
        yield
    finally:
        for name, before in saved.items():
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before


def _execute(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    job_name: str,
    box: Box,
    tags: dict[str, str] | None,
    log_level: str,
    regions: Mapping[str, str | None] | None = None,
) -> RunRecord:
    # The range tags make one run cover the whole box (a stretch of the partitions' order).
    run_tags = {RANGE_START: box.start, RANGE_END: box.end}
    if len(box.tenants) == 1:
        run_tags["tenant"] = box.tenants[0]  # the run queue's per-tenant limit
    else:
        run_tags["tenants"] = str(len(box.tenants))
    # The run queue's per-region limit (regions.py; a box of pooling.pool_by_region has one).
    run_tags.update(region_tags((regions or {}).get(t) for t in box.tenants))
    result = defs.resolve_job_def(job_name).execute_in_process(
        instance=instance,
        run_config={"loggers": {"console": {"config": {"log_level": log_level}}}},
        tags={**run_tags, **(tags or {})},
        raise_on_error=False,
    )
    rec = record_of(result, job_name)
    if rec.interrupted:
        # Dagster turns SIGTERM/SIGINT inside a step into a failure; for the operator (and the
        # UI) the run was stopped on purpose. What had finished is committed (the pipeline's
        # writer flushes on the way out); calls in flight show up as orphan attempts.
        instance.report_run_canceled(result.dagster_run, message="stopped by SIGTERM/SIGINT")
        rec.error = "stopped by a signal (SIGTERM/SIGINT); finished work was committed"
    return rec


def stretches(keys: Sequence[str], order: Sequence[str]) -> list[Box]:
    """``keys`` as boxes of consecutive partitions in the instance's ``order``, one tenant
    each (a run per tenant keeps its per-tenant queue limit); unregistered keys alone."""
    at = {k: i for i, k in enumerate(order)}
    boxes: list[list[str]] = []
    for key in sorted(dict.fromkeys(keys), key=lambda k: (at.get(k, len(at)), k)):
        prev = boxes[-1][-1] if boxes else None
        here = at.get(key)
        if (
            prev is not None
            and here is not None
            and at.get(prev) == here - 1
            and tenant_of(prev) == tenant_of(key)
        ):
            boxes[-1].append(key)
        else:
            boxes.append([key])
    return [Box(tuple(b)) for b in boxes]


def materialize(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    job_name: str,
    tenants: Sequence[str],
    slices: Sequence[str],
    tags: dict[str, str] | None = None,
    log_level: str = "INFO",
    apply_job: str | None = None,
) -> list[RunRecord]:
    """Run ``job_name`` over the partitions tenants x slices as given, registering them: one
    run per tenant stretch (no planning; ``run_boxes`` runs a plan's pooled boxes)."""
    keys = [partition_key_for(t, s) for t in tenants for s in slices]  # raises before anything
    order = register(instance, keys)
    return run_boxes(defs, instance, job_name, stretches(keys, order), tags, log_level, apply_job)


def run_boxes(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    job_name: str,
    boxes: Sequence[Box],
    tags: dict[str, str] | None = None,
    log_level: str = "INFO",
    apply_job: str | None = None,
    regions: Mapping[str, str | None] | None = None,
) -> list[RunRecord]:
    """One in-process run per box (``regions``, tenant -> region, tags each run).

    Blocking checks gate the apply per *run*, so one bad partition keeps the apply from every
    partition of its box. With ``apply_job``, the partitions of such a run that passed every
    blocking check are applied in follow-up runs (one per tenant and contiguous slice range);
    that job's asset re-verifies them before writing.
    """
    records: list[RunRecord] = []
    # The partitions these boxes were planned from are listed once for all their runs.
    with listed_once(instance):
        for box in boxes:
            with fewer_event_writes():
                rec = _execute(defs, instance, job_name, box, tags, log_level, regions)
            records.append(rec)
            if rec.interrupted:
                break  # stopped by a signal: start nothing more
            blocked = rec.blocked()
            if apply_job is None or rec.success or not blocked:
                continue
            clean = [
                pk
                for pk, outcomes in rec.checks.items()
                if pk not in blocked
                and pk not in rec.applied
                and {c.name for c in outcomes} >= set(BLOCKING_CHECKS)
            ]
            for follow in stretches(clean, partition_keys(instance)) if clean else []:
                records.append(
                    _execute(defs, instance, apply_job, follow, tags, log_level, regions)
                )
    return records
