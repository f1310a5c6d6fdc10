"""Materialise partitions in-process through Dagster: a few runs, not one per partition."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from .check_rules import BLOCKING_CHECKS
from .keys import SLICE_KEYS, validate_tenant_id
from .partitions import partition_key_for, partition_ref, tenant_partitions
from .range_guard import RANGE_END, RANGE_START
from .regions import run_tags

LABELS = dg.AssetKey("moderation_labels")
APPLIED = dg.AssetKey("applied_labels")


@dataclass(frozen=True)
class CheckOutcome:
    """One check's evaluation of one partition in one run."""

    name: str
    passed: bool
    blocking: bool
    severity: str
    summary: str | None


@dataclass
class RunRecord:
    """One in-process Dagster run and what it materialised.

    ``partitions`` and ``metadata`` are moderation_labels'; ``applied`` lists the partitions
    applied_labels materialised, ``checks`` each partition's check outcomes.
    """

    run_id: str
    success: bool
    partitions: list[str]
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: str | None = None
    checks: dict[str, list[CheckOutcome]] = field(default_factory=dict)
    applied: list[str] = field(default_factory=list)
    job: str = ""

    def blocked(self) -> dict[str, list[str]]:
        """Partitions with failed blocking checks, and which."""
        out: dict[str, list[str]] = {}
        for pk, outcomes in self.checks.items():
            names = [c.name for c in outcomes if c.blocking and not c.passed]
            if names:
                out[pk] = names
        return out


def rectangles(tenants: Sequence[str], slices: Sequence[str]) -> list[tuple[str, str, str]]:
    """(tenant, first slice, last slice) runs covering the selection with contiguous slices."""
    chosen = sorted(set(slices), key=SLICE_KEYS.index)
    groups: list[tuple[str, str]] = []
    for s in chosen:
        if groups and SLICE_KEYS.index(s) == SLICE_KEYS.index(groups[-1][1]) + 1:
            groups[-1] = (groups[-1][0], s)
        else:
            groups.append((s, s))
    return [(t, a, b) for t in tenants for a, b in groups]


def ensure_tenant_partitions(instance: dg.DagsterInstance, tenants: Sequence[str]) -> None:
    """Register tenants as dynamic partitions (idempotent); invalid ids raise first."""
    for tenant in tenants:
        validate_tenant_id(tenant)
    name = tenant_partitions.name or "tenants"
    known = set(instance.get_dynamic_partitions(name))
    new = [t for t in tenants if t not in known]
    if new:
        instance.add_dynamic_partitions(name, new)


def _metadata_value(value: Any) -> Any:
    return getattr(value, "value", value)


def _record(result: dg.ExecuteInProcessResult, job_name: str) -> RunRecord:
    rec = RunRecord(run_id=result.run_id, success=result.success, partitions=[], job=job_name)
    for ev in result.get_asset_materialization_events():
        mat = ev.event_specific_data.materialization  # type: ignore[union-attr]
        if mat is None or mat.partition is None:
            continue
        pk = str(mat.partition)
        if mat.asset_key == APPLIED:
            rec.applied.append(pk)
        elif mat.asset_key == LABELS:
            rec.partitions.append(pk)
            rec.metadata[pk] = {k: _metadata_value(v) for k, v in mat.metadata.items()}
    for evaluation in result.get_asset_check_evaluations():
        if evaluation.partition is None:
            continue
        rec.checks.setdefault(evaluation.partition, []).append(
            CheckOutcome(
                name=evaluation.check_name,
                passed=evaluation.passed,
                blocking=bool(evaluation.blocking),
                severity=evaluation.severity.value,
                summary=evaluation.description,
            )
        )
    if not result.success:
        failures = [e for e in result.all_events if e.is_failure]
        rec.error = _failure_text(failures[0]) if failures else "run failed"
    return rec


def _failure_text(event: dg.DagsterEvent) -> str:
    """The step's failure message plus the asset's ``dg.Failure`` description, which says why
    (e.g. the region without an endpoint); the message alone only names the step."""
    user = getattr(event.event_specific_data, "user_failure_data", None)
    description = getattr(user, "description", None)
    message = event.message or "run failed"
    return f"{message} {description}" if description else message


def _execute(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    job_name: str,
    tenant: str,
    first: str,
    last: str,
    tags: dict[str, str] | None,
    log_level: str,
) -> RunRecord:
    start, end = partition_key_for(tenant, first), partition_key_for(tenant, last)
    result = defs.resolve_job_def(job_name).execute_in_process(
        instance=instance,
        run_config={"loggers": {"console": {"config": {"log_level": log_level}}}},
        tags={RANGE_START: start, RANGE_END: end, "tenant": tenant, **(tags or {})},
        raise_on_error=False,
    )
    return _record(result, job_name)


def materialize(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    job_name: str,
    tenants: Sequence[str],
    slices: Sequence[str],
    tags: dict[str, str] | None = None,
    log_level: str = "INFO",
    apply_job: str | None = None,
    regions: Mapping[str, str | None] | None = None,
) -> list[RunRecord]:
    """Run ``job_name`` over tenants x slices: one in-process run per tenant and slice range.

    Blocking checks gate the apply per *run*, so one bad partition keeps the apply from every
    partition of its range. With ``apply_job``, the partitions of such a run that passed every
    blocking check are applied in a follow-up run (contiguous ranges again); that job's asset
    re-verifies them before writing.

    ``regions`` (tenant -> region) adds each run's ``region`` tag for the run queue.
    """
    for tenant in tenants:
        for slice_key in slices:
            partition_ref(partition_key_for(tenant, slice_key))  # raises before anything runs
    ensure_tenant_partitions(instance, tenants)
    records: list[RunRecord] = []
    for tenant, first, last in rectangles(tenants, slices):
        # Runs are per tenant, so each has one region (regions.run_tags pools several).
        run = {**(tags or {}), **run_tags([(regions or {}).get(tenant)])}
        rec = _execute(defs, instance, job_name, tenant, first, last, run, log_level)
        records.append(rec)
        blocked = rec.blocked()
        if apply_job is None or rec.success or not blocked:
            continue
        clean = [
            partition_ref(pk)
            for pk, outcomes in rec.checks.items()
            if pk not in blocked
            and pk not in rec.applied
            and {c.name for c in outcomes} >= set(BLOCKING_CHECKS)
        ]
        clean_slices = [f"s{ref.slice:02d}" for ref in clean]
        for _t, a, b in rectangles([tenant], clean_slices):
            records.append(_execute(defs, instance, apply_job, tenant, a, b, run, log_level))
    return records
