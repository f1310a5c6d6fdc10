"""Per-partition asset checks on moderation_labels, one result per partition even in range runs.

Dagster 1.13's ``AssetCheckResult`` has no partition field: inside a run that covers a range of
partitions it is recorded as one *unpartitioned* evaluation, and a second result for the same
check fails the step ("returned an output multiple times"). The event it is converted into,
``AssetCheckEvaluation``, does carry ``partition``; a check function may yield it directly, and
the event log then fills the per-partition rows that the run's "planned" event created. So the
checks yield one ``AssetCheckEvaluation`` per partition and check, with ``blocking`` set from
the spec: a failed blocking evaluation still fails the step and keeps ``applied_labels`` out of
the run (see README, "Checks in multi-partition runs").
"""

import json
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    # Not re-exported by ``dagster`` in 1.13; the evaluation's pointer to the checked
    # materialisation, which AssetCheckResult would fill in for a single-partition step.
    AssetCheckEvaluationTargetMaterializationData as TargetMaterialization,
)
from sqlalchemy.engine import Engine

from .check_rules import (
    CHECK_GROUPS,
    CHECK_NAMES,
    GroupVerdict,
    Verdict,
    evaluate,
    group_verdicts,
)
from .keys import Versions
from .partitions import moderation_partitions, run_refs
from .pipeline import PartitionRef, with_levels
from .policy import PolicyResource
from .resources import BackfillSettings, ModelResource, StoreResource, run_versions
from .store.apply import rubric_version
from .store.audit import partition_evidence
from .store.engine import read_tx
from .store.reports import live_label_counts

LABELS_KEY = dg.AssetKey("moderation_labels")
CHECKS_NAME = "moderation_label_checks"


def loaded_code_version(job: dg.JobDefinition) -> str | None:
    """moderation_labels' code version as the definitions loaded it (None outside a job)."""
    layer = job.asset_layer
    return layer.get(LABELS_KEY).code_version if layer.has(LABELS_KEY) else None


def verdicts_for(
    engine: Engine,
    ref: PartitionRef,
    versions: Versions,
    policy: PolicyResource,
    names: Sequence[str] = CHECK_NAMES,
    deferred: int | None = None,
    sample: int = 5,
) -> list[Verdict]:
    """Gather one partition's rows and judge them (shared by checks, gate and CLI)."""
    with read_tx(engine) as conn:
        ev = partition_evidence(conn, ref.tenant_id, ref.slice, ref.slices, versions)
        if "label_drift" in names:
            configured = policy.configured_baseline()
            if configured is not None:
                ev.baseline, ev.baseline_source = configured, "configured"
            else:
                live = live_label_counts(conn, ref.tenant_id, rubric_version(versions))
                total = sum(live.values())
                if total:
                    ev.baseline = {k: n / total for k, n in live.items()}
                    ev.baseline_source = f"live ({total} posts)"
                else:
                    ev.baseline_source = "live: no live labels yet"
    ev.deferred = deferred
    return evaluate(ev, policy.bounds(), names, sample=sample)


def verdict_metadata(v: Verdict) -> dict[str, Any]:
    """What a person needs to act on a verdict: counts, a few keys and the inspect command."""
    md: dict[str, Any] = dict(v.counts)
    md["summary"] = dg.MetadataValue.text(v.summary)
    if v.sample_keys:
        # Plain text: the UI shows it inline, where markdown would hide behind a button.
        md["offending_sample"] = dg.MetadataValue.text("\n".join(v.sample_keys))
    if v.table:
        md["table"] = dg.MetadataValue.md(v.table)
    md["inspect"] = dg.MetadataValue.text(v.inspect)
    return md


def group_metadata(gv: GroupVerdict) -> dict[str, Any]:
    """One evaluation's metadata: each member's result, and what to act on for failures.

    Numbers stay typed (``int``/``float`` metadata) so Dagster can plot them; the members'
    results are also a JSON list (``checks_json``) the CLI reads back.
    """
    rows = ["| check | blocking | result | summary |", "|---|---|---|---|"]
    md: dict[str, Any] = {}
    for v in gv.members:
        result = "passed" if v.passed else ("warning" if v.warn else "FAILED")
        rows.append(f"| {v.name} | {'yes' if v.blocking else 'no'} | {result} | {v.summary} |")
        for name, value in v.counts.items():
            md[f"{v.name}.{name}"] = value
        if not v.passed:
            if v.sample_keys:
                md[f"{v.name}.offending_sample"] = dg.MetadataValue.text("\n".join(v.sample_keys))
            if v.table:
                md[f"{v.name}.table"] = dg.MetadataValue.md(v.table)
            md[f"{v.name}.inspect"] = dg.MetadataValue.text(v.inspect)
    md["checks"] = dg.MetadataValue.md("\n".join(rows))
    md["failed"] = dg.MetadataValue.text(", ".join(v.name for v in gv.failed) or "-")
    md["checks_json"] = dg.MetadataValue.text(
        json.dumps(
            [
                {"name": v.name, "passed": v.passed, "blocking": v.blocking, "warn": v.warn}
                for v in gv.members
            ]
        )
    )
    return md


def _latest_materialization(
    instance: dg.DagsterInstance, partition_key: str
) -> tuple[TargetMaterialization | None, int | None]:
    """The partition's latest materialisation (checks point at it) and its deferred count."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=LABELS_KEY, asset_partitions=[partition_key]), limit=1
    ).records
    if not records:
        return None, None
    rec = records[0]
    mat = rec.event_log_entry.asset_materialization
    deferred_md = mat.metadata.get("outcome_deferred") if mat is not None else None
    deferred = getattr(deferred_md, "value", None)
    target = TargetMaterialization(
        storage_id=rec.storage_id, run_id=rec.run_id, timestamp=rec.timestamp
    )
    return target, int(deferred) if isinstance(deferred, int) else None


def _evaluation(
    gv: GroupVerdict,
    partition_key: str,
    target: TargetMaterialization | None,
) -> dg.AssetCheckEvaluation:
    # Only an ERROR evaluation of a blocking check gates the downstream step; a group whose
    # failed members are all warnings (drift) is reported as WARN.
    severity = dg.AssetCheckSeverity.WARN if gv.warn_only else dg.AssetCheckSeverity.ERROR
    return dg.AssetCheckEvaluation(
        asset_key=LABELS_KEY,
        check_name=gv.group.name,
        passed=gv.passed,
        metadata=group_metadata(gv),
        target_materialization_data=target,
        severity=severity,
        description=gv.summary,
        blocking=gv.group.blocking,
        partition=partition_key,
    )


def build_partition_checks() -> dg.AssetChecksDefinition:
    """The six checks in two groups (``check_rules.CHECK_GROUPS``), one multi-check: the
    partition's rows are read once for all of them."""
    with warnings.catch_warnings():
        # Partitioned checks are "preview" in Dagster 1.13; the warning is noise on every load.
        warnings.simplefilter("ignore", dg.PreviewWarning)
        specs = [
            dg.AssetCheckSpec(
                g.name,
                asset=LABELS_KEY,
                blocking=g.blocking,
                description=g.description,
                partitions_def=moderation_partitions,
            )
            for g in CHECK_GROUPS
        ]
    return _checks(specs)


def _checks(specs: list[dg.AssetCheckSpec]) -> dg.AssetChecksDefinition:
    @dg.multi_asset_check(specs=specs, can_subset=True, name=CHECKS_NAME)
    def moderation_label_checks(
        context: dg.AssetCheckExecutionContext,
        store: StoreResource,
        model: ModelResource,
        settings: BackfillSettings,
        policy: PolicyResource,
    ) -> Iterator[dg.AssetCheckEvaluation | dg.Output[None]]:
        """Integrity (blocking) and spend and drift, one evaluation each per partition."""
        refs = run_refs(context.partition_keys)
        job = context.op_execution_context.job_def
        _rubric, versions = run_versions(settings, model, loaded_code_version(job))
        refs = with_levels(store.engine(), refs)
        selected = {k.name for k in context.selected_asset_check_keys}
        names = [m for g in CHECK_GROUPS if g.name in selected for m in g.members]
        failed: dict[str, list[str]] = {}
        for ref in refs:
            pk = ref.key
            target, deferred = _latest_materialization(context.instance, pk)
            verdicts = verdicts_for(store.engine(), ref, versions, policy, names, deferred)
            for v in verdicts:
                if not v.passed:
                    failed.setdefault(v.name, []).append(pk)
            for gv in group_verdicts(verdicts):
                yield _evaluation(gv, pk, target)
        for name, pks in failed.items():
            context.log.warning(f"{name} failed for {len(pks)} partition(s): {', '.join(pks[:10])}")
        # One output per selected check lets Dagster wire the check to downstream steps; the
        # gating itself comes from the failed blocking evaluations above.
        outputs = context.op_execution_context.assets_def.check_specs_by_output_name
        for output_name, spec in outputs.items():
            if spec.name in selected:
                yield dg.Output(None, output_name=output_name)

    return moderation_label_checks
