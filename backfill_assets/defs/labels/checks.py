"""Per-partition asset checks on moderation_labels, one result per partition even in range runs.

Dagster 1.13's ``AssetCheckResult`` has no partition field: inside a run that covers a range of
partitions it is recorded as one *unpartitioned* evaluation, and a second result for the same
check fails the step ("returned an output multiple times"). The event it is converted into,
``AssetCheckEvaluation``, does carry ``partition``; a check function may yield it directly, and
the event log then fills the per-partition rows that the run's "planned" event created. So the
checks yield one ``AssetCheckEvaluation`` per partition and check, with ``blocking`` set from
the failed members: a failed blocking member still fails the step and keeps ``applied_labels``
out of the run (docs/architecture.md, "Checks in multi-partition runs"); spend and drift alone
do not.
"""

import functools
import json
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import dagster as dg
from sqlalchemy.engine import Engine

from backfill_assets.config.stages import CASCADE_MODEL
from backfill_assets.config.variables import ChecksSettings, StoreSettings
from backfill_assets.defs.asset_keys import CHECK_KEYS, LABELS
from backfill_assets.defs.instance_api import (
    check_states,
    materializations,
    target_materialization,
)
from backfill_assets.defs.labels.metadata import int_value, text_value
from backfill_assets.defs.model_resources import ModelResource, run_versions
from backfill_assets.defs.partitions import moderation_partitions, run_refs
from backfill_assets.defs.sealing import NO_CONFIG
from backfill_assets.dispatch.partition_run import PartitionRef
from backfill_assets.dispatch.pipeline import with_levels
from backfill_assets.domain.checks.catalog import (
    CHECK_GROUPS,
    CHECK_NAMES,
    CheckResult,
    GroupResult,
    group_results,
)
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.domain.work.keys import Versions
from backfill_assets.ledger.decisions.agreement import agreement_pairs, pairs_by_tenant
from backfill_assets.ledger.engine import read_tx, refresh_planner_stats
from backfill_assets.ledger.engines import store_engine
from backfill_assets.ledger.evaluations import gold_shares
from backfill_assets.ledger.evidence import check_pool
from backfill_assets.ledger.evidence.evidence import Partition
from backfill_assets.ledger.evidence.partition_checks import Baseline, CheckSetup, check_partitions
from backfill_assets.ledger.reports import live_label_counts
from backfill_assets.ledger.run.partition_counts import post_counts

CHECKS_NAME = "moderation_label_checks"


def loaded_code_version(job: dg.JobDefinition) -> str | None:
    """moderation_labels' code version as the definitions loaded it (None outside a job)."""
    layer = job.asset_layer
    return layer.get(LABELS).code_version if layer.has(LABELS) else None


def check_results_for(
    engine: Engine,
    ref: PartitionRef,
    versions: Versions,
    rubric: Rubric,
    checks: ChecksSettings,
    names: Sequence[str] = CHECK_NAMES,
    deferred: int | None = None,
    sample: int = 5,
) -> list[CheckResult]:
    """Gather one partition's rows and check them (shared by checks, gate and CLI)."""
    return check_results_for_many(
        engine, [ref], versions, rubric, checks, names, {ref.key: deferred}, sample
    )[ref.key]


def check_results_for_many(
    engine: Engine,
    refs: Sequence[PartitionRef],
    versions: Versions,
    rubric: Rubric,
    checks: ChecksSettings,
    names: Sequence[str] = CHECK_NAMES,
    deferred: Mapping[str, int | None] | None = None,
    sample: int = 5,
    log: Callable[[str], None] = lambda _m: None,
    pooling: check_pool.Pooling | None = None,
) -> dict[str, list[CheckResult]]:
    """Check results for several partitions (``partition_checks.check_partitions``), each
    tenant's drift baseline read once; a big run's partitions are checked by worker processes
    (``ledger/evidence/check_pool.py``, as ``pooling`` says), since one process would leave the
    other cores idle. The stored results of ``versions`` are checked against ``rubric``'s
    labels and rules."""
    pooling = pooling or check_pool.Pooling()
    partitions = [Partition(r.key, r.tenant_id, r.slice, r.slices) for r in refs]
    tenants = sorted({r.tenant_id for r in refs})
    # The run's labels step has just written these tables; with statistics from before it
    # (the ledger's from the last autovacuum, if any) PostgreSQL read each group's evidence
    # by scanning them whole: the ledger alone 2.17 million rows in a run of 10,000 small
    # tenants, 19,000 with this (only a table whose row count moved past 2x is analysed).
    refresh_planner_stats(engine, ("results", "ledger_events", "dead_letters"))
    drift = "label_drift" in names
    configured = checks.configured_baseline(rubric.policy) if drift else None
    baselines: dict[str, Baseline] = {}
    if configured is not None:
        baselines = {t: (dict(configured), "configured") for t in tenants}
    with read_tx(engine) as conn:
        # Read once: both the worker plan and the checks group partitions by their posts.
        counts = post_counts(conn, tenants)
        if drift and configured is None:
            live = live_label_counts(conn, tenants, versions.code_version)
            baselines = {t: _live_baseline(live[t]) for t in tenants}
        shares = (
            gold_shares(conn, versions.key_version, versions.model, versions.mapping)
            if "stage_drift" in names and versions.model == CASCADE_MODEL
            else None
        )
        # The model against moderators, tenant-wide under the policy version in force.
        agreement = (
            pairs_by_tenant(
                agreement_pairs(
                    conn,
                    rubric.policy.policy_id,
                    versions.model,
                    versions.task_version,
                    tenants,
                    versions.key_version,
                )
            )
            if "agreement" in names
            else None
        )
    setup = CheckSetup(
        versions,
        rubric.contract,
        checks.bounds(rubric.policy),
        tuple(names),
        baselines,
        dict(deferred or {}),
        sample,
        # The first stage's share on the gold set (shares are in the stages' order).
        next(iter(shares.items())) if shares else None,
        None if agreement is None else {t: agreement.get(t, {}) for t in tenants},
    )
    chunks = check_pool.plan(partitions, counts, pooling)
    if chunks is not None:
        procs = min(pooling.workers, len(chunks))
        log(f"checking {len(refs)} partition(s) in {procs} worker processes")
        return check_pool.check_chunks(engine, chunks, setup, log=log, pooling=pooling)
    return check_partitions(engine, partitions, setup, counts)


def _live_baseline(live: Mapping[str, int]) -> Baseline:
    """A tenant's drift baseline from its live labels' shares (no configured baseline)."""
    total = sum(live.values())
    if not total:
        return None, "live: no live labels yet"
    return {k: n / total for k, n in live.items()}, f"live ({total} posts)"


# Members whose table is shown when they pass too (agreement's labels table is its figures).
_TABLE_ALWAYS = frozenset({"agreement"})


def group_metadata(gv: GroupResult) -> dict[str, Any]:
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
            md[f"{v.name}.{name}"] = int_value(value) if type(value) is int else value
        if v.table and v.name in _TABLE_ALWAYS:
            md[f"{v.name}.table"] = dg.MetadataValue.md(v.table)
        if not v.passed:
            if v.sample_keys:
                md[f"{v.name}.offending_sample"] = dg.MetadataValue.text("\n".join(v.sample_keys))
            if v.table and v.name not in _TABLE_ALWAYS:
                md[f"{v.name}.table"] = dg.MetadataValue.md(v.table)
            md[f"{v.name}.inspect"] = dg.MetadataValue.text(v.inspect)
    md["checks"] = dg.MetadataValue.md("\n".join(rows))
    md["failed"] = text_value(", ".join(v.name for v in gv.failed) or "-")
    md["checks_json"] = _members_json(
        tuple((v.name, v.passed, v.blocking, v.warn) for v in gv.members)
    )
    return md


@functools.lru_cache(maxsize=256)
def _members_json(members: tuple[tuple[str, bool, bool, bool], ...]) -> dg.TextMetadataValue:
    """``checks_json`` of a group's members (name, passed, blocking, warn): most partitions
    share one, so it is written once."""
    return dg.MetadataValue.text(
        json.dumps(
            [
                {"name": name, "passed": passed, "blocking": blocking, "warn": warn}
                for name, passed, blocking, warn in members
            ]
        )
    )


def _latest_materializations(
    instance: dg.DagsterInstance, partition_keys: Sequence[str]
) -> dict[str, tuple[Any, int | None]]:
    """Each partition's latest materialisation (checks point at it) and its deferred count,
    in two queries for the whole run (``instance_api.materializations``)."""
    latest = instance.event_log_storage.get_latest_storage_id_by_partition(
        LABELS, dg.DagsterEventType.ASSET_MATERIALIZATION, set(partition_keys)
    )
    found = materializations(instance, LABELS, list(latest.values()))
    out: dict[str, tuple[Any, int | None]] = {}
    for pk in partition_keys:
        got = found.get(latest.get(pk, -1))
        if got is None:
            out[pk] = (None, None)
            continue
        out[pk] = (target_materialization(got), got.ints.get("outcome_deferred"))
    return out


def _evaluation(
    gv: GroupResult,
    partition_key: str,
    target: Any,
) -> dg.AssetCheckEvaluation:
    # Dagster gates the downstream step on a failed ERROR evaluation with ``blocking`` set: it
    # is set (as the spec says) unless the failed members are all non-blocking (spend, drift).
    # A group whose failed members are all warnings (drift) is reported as WARN.
    severity = dg.AssetCheckSeverity.WARN if gv.warn_only else dg.AssetCheckSeverity.ERROR
    return dg.AssetCheckEvaluation(
        asset_key=LABELS,
        check_name=gv.group.name,
        passed=gv.passed,
        metadata=group_metadata(gv),
        target_materialization_data=target,
        severity=severity,
        description=gv.summary,
        blocking=gv.group.blocking and (gv.passed or gv.blocks),
        partition=partition_key,
    )


def build_partition_checks(rubric: Rubric) -> dg.AssetChecksDefinition:
    """The nine checks in one group (``check_defs.CHECK_GROUPS``), one multi-check: the
    partition's rows are read once for all of them. ``rubric``: the policy the definitions
    loaded (the stored results are checked against its labels and rules), closed over like
    the asset's."""
    with warnings.catch_warnings():
        # Partitioned checks are "preview" in Dagster 1.13; the warning is noise on every load.
        warnings.simplefilter("ignore", dg.PreviewWarning)
        specs = [
            dg.AssetCheckSpec(
                g.name,
                asset=LABELS,
                blocking=g.blocking,
                description=g.description,
                partitions_def=moderation_partitions,
            )
            for g in CHECK_GROUPS
        ]
    return _checks(specs, rubric)


def _checks(specs: list[dg.AssetCheckSpec], rubric: Rubric) -> dg.AssetChecksDefinition:
    @dg.multi_asset_check(specs=specs, can_subset=True, name=CHECKS_NAME, config_schema=NO_CONFIG)
    def moderation_label_checks(
        context: dg.AssetCheckExecutionContext,
        store: dg.ResourceParam[StoreSettings],
        model: dg.ResourceParam[ModelResource],
        checks: dg.ResourceParam[ChecksSettings],
    ) -> Iterator[dg.AssetCheckEvaluation | dg.Output[None]]:
        """One evaluation per partition and group (``integrity``: every check)."""
        refs = run_refs(context.partition_keys)
        job = context.op_execution_context.job_def
        versions = run_versions(model, rubric, loaded_code_version(job))
        refs = with_levels(store_engine(store), refs)
        selected = {k.name for k in context.selected_asset_check_keys}
        names = [m for g in CHECK_GROUPS if g.name in selected for m in g.members]
        failed: dict[str, list[str]] = {}
        latest = _latest_materializations(context.instance, [ref.key for ref in refs])
        checked = check_results_for_many(
            store_engine(store),
            refs,
            versions,
            rubric,
            checks,
            names,
            {k: d for k, (_t, d) in latest.items()},
            log=context.log.info,
        )
        for ref in refs:
            pk = ref.key
            target = latest[pk][0]
            check_results = checked[pk]
            for v in check_results:
                if not v.passed:
                    failed.setdefault(v.name, []).append(pk)
            for gv in group_results(check_results):
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


def check_status(
    instance: dg.DagsterInstance, partition_keys: Sequence[str]
) -> dict[str, dict[str, str]]:
    """Each partition's check groups as the instance recorded them, one of ``CHECK_STATES``:
    ``passed``, ``failed``, ``failed, not blocking`` (spend or drift only: the labels were
    applied), ``older`` (the latest evaluation is of an earlier materialisation) or ``never
    ran``."""
    out = {pk: {g.name: "never ran" for g in CHECK_GROUPS} for pk in partition_keys}
    for key in CHECK_KEYS:
        for pk, state in check_states(instance, key, partition_keys).items():
            if pk in out:
                out[pk][key.name] = state
    return out
