"""applied_labels: accepted labels written onto the posts, only for partitions that verify."""

import warnings
from collections.abc import Sequence
from typing import Any

import dagster as dg
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.config.variables import ChecksSettings, StoreSettings
from backfill_assets.defs.asset_keys import APPLIED, BLOCKING_GROUPS, LABELS
from backfill_assets.defs.instance_api import add_partition_metadata, unblocked_in_run
from backfill_assets.defs.labels.checks import check_results_for, loaded_code_version
from backfill_assets.defs.model_resources import ModelResource, run_versions
from backfill_assets.defs.partitions import moderation_partitions, run_refs
from backfill_assets.defs.sealing import NO_CONFIG
from backfill_assets.dispatch.partition_run import PartitionRef
from backfill_assets.dispatch.pipeline import with_levels
from backfill_assets.domain.checks.catalog import BLOCKING_CHECKS, blocking_failures
from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.ledger.engine import read_tx, refresh_planner_stats, write_tx
from backfill_assets.ledger.engines import store_engine
from backfill_assets.ledger.labels.apply import ApplyReport, apply_partitions, newer_versions
from backfill_assets.ledger.run import partition_marks
from backfill_assets.ledger.run.partition_counts import post_counts
from backfill_assets.ledger.run.partition_groups import grouped_by_posts
from backfill_assets.platform_db.sink import Sink, SinkError, SinkReport, gaps, write_partition


def apply_metadata(rep: ApplyReport) -> dict[str, Any]:
    """Metadata of one partition's apply."""
    return {
        "eligible": dg.MetadataValue.int(rep.eligible),
        "changed": dg.MetadataValue.int(rep.changed),
        "unchanged": dg.MetadataValue.int(rep.unchanged),
        "newer_version_kept": dg.MetadataValue.int(rep.newer_kept),
        # Posts whose label in force is a moderator's decision (issue 50): never replaced.
        "human_decision_kept": dg.MetadataValue.int(rep.human_kept),
        "target_columns": dg.MetadataValue.text(rep.target),
        "rubric_version": dg.MetadataValue.text(rep.code_version),
        "policy_version": dg.MetadataValue.text(rep.policy_version),
    }


def passed_in_run(context: dg.AssetExecutionContext, run_keys: Sequence[str]) -> set[str]:
    """Of the run's partitions ``run_keys``, those whose checks did not block earlier in this
    run (passed, or failed on non-blocking members only)."""
    passed = unblocked_in_run(
        context.instance, LABELS, BLOCKING_GROUPS, context.run.run_id, run_keys
    )
    return {pk for pk, names in passed.items() if names >= set(BLOCKING_GROUPS)}


def write_back(
    engine: Engine,
    sink: Sink,
    refs: Sequence[PartitionRef],
    policy: Policy,
    only_gaps: bool = True,
) -> tuple[dict[str, SinkReport], SinkError | None]:
    """Each partition's applied labels into the sink, in order; stops at the first partition
    the sink refuses (a sink that is down would refuse them all, each after a timeout).
    ``only_gaps``: partitions already written back since their last change are skipped (one
    grouped query), so re-applying unchanged partitions costs the sink nothing."""
    with read_tx(engine) as conn:
        newer = newer_versions(conn, policy)
        if only_gaps and refs:
            tenants = sorted({r.tenant_id for r in refs})
            found = gaps(conn, sink.sink_id, policy.key_version, tenants)
            refs = [r for r in refs if any((r.tenant_id, s) in found for s in r.slices)]
    done: dict[str, SinkReport] = {}
    try:
        sink_engine = sink.engine()
    except SinkError as exc:  # a URL no driver here can open
        return done, exc
    try:
        # One connection for the whole write-back (a batch is a transaction on it).
        with sink_engine.connect() as conn:
            for ref in refs:
                try:
                    done[ref.key] = write_partition(
                        engine, sink, conn, ref.tenant_id, ref.slices, policy, newer
                    )
                except SinkError as exc:
                    return done, exc
    except sa.exc.SQLAlchemyError as exc:  # the connection itself: the sink is unreachable
        return done, sink.error(exc)
    finally:
        sink_engine.dispose()
    return done, None


def build_applied_labels(
    rubric: Rubric, partitions_per_run: int, sink: Sink | None = None
) -> dg.AssetsDefinition:
    """The apply asset; same partitions and backfill policy as moderation_labels, and the
    same policy (``rubric``, closed over: it decides what is applied under which version).
    ``sink`` (BACKFILL_SINK_URL, closed over like the policy: no run config can point labels
    at another database) also receives every applied label."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return _applied_asset(rubric, partitions_per_run, sink)


def _applied_asset(
    rubric: Rubric, partitions_per_run: int, sink: Sink | None
) -> dg.AssetsDefinition:
    @dg.asset(
        config_schema=NO_CONFIG,
        key=APPLIED,
        partitions_def=moderation_partitions,
        # Same policy as moderation_labels, so a backfill puts both in the same runs and the
        # blocking checks gate the apply inside each run.
        backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=partitions_per_run),
        deps=[LABELS],
        group_name="moderation",
        kinds={"sql"},
        code_version="apply-1",
    )
    def applied_labels(
        context: dg.AssetExecutionContext,
        store: dg.ResourceParam[StoreSettings],
        model: dg.ResourceParam[ModelResource],
        checks: dg.ResourceParam[ChecksSettings],
    ) -> dg.MaterializeResult[None]:
        """Keyed upsert of accepted labels (label, rule ids, policy version) per (tenant,
        post, policy id), and onto the posts' shadow columns (live ones when switched)."""
        run_keys = context.partition_keys
        refs = run_refs(run_keys)
        versions = run_versions(model, rubric, loaded_code_version(context.job_def))
        engine = store_engine(store)
        refs = with_levels(engine, refs)
        # Dagster's blocking checks gate this step when they ran in the same run. Launched on
        # its own (UI, or the CLI's per-partition follow-up) it would not be gated, so for any
        # partition this run did not check, the same blocking checks run here; nothing is
        # written unless every partition passes.
        checked = passed_in_run(context, run_keys)
        blocked: dict[str, list[str]] = {}
        for ref in refs:
            if ref.key in checked:
                continue
            fails = blocking_failures(
                check_results_for(engine, ref, versions, rubric, checks, BLOCKING_CHECKS)
            )
            if fails:
                blocked[ref.key] = fails
        if blocked:
            lines = [f"{pk}: {', '.join(names)}" for pk, names in sorted(blocked.items())]
            raise dg.Failure(
                description=f"{len(blocked)} partition(s) fail blocking checks; nothing applied",
                metadata={"blocked": dg.MetadataValue.md("\n".join(f"- {x}" for x in lines))},
            )
        changed = 0
        applied: dict[str, dict[str, Any]] = {}
        # The apply joins posts, results and applied_labels. Without statistics for
        # applied_labels, PostgreSQL estimates a handful of rows and scans the whole table for
        # every group: 50 ms a group at 2,500 applied posts, 300 ms at 50,000.
        refresh_planner_stats(engine, ("applied_labels",))
        # A transaction per group of partitions: a commit each cost more than a small
        # tenant's apply, and a group of few posts holds the write lock briefly.
        with read_tx(engine) as conn:
            sizes = post_counts(conn, sorted({r.tenant_id for r in refs}))
        for group in grouped_by_posts(refs, sizes):
            with write_tx(engine) as conn:
                reps = apply_partitions(
                    conn,
                    [(r.tenant_id, r.slices) for r in group],
                    versions,
                    rubric.policy,
                    live=checks.apply_live,
                )
            for ref, rep in zip(group, reps, strict=True):
                changed += rep.changed
                applied[ref.key] = apply_metadata(rep)
        context.log.info(f"applied labels to {changed} post(s) in {len(refs)} partition(s)")
        if sink is not None:
            written, failed = write_back(engine, sink, refs, rubric.policy)
            for key, wrote in written.items():
                applied[key]["sink_rows"] = dg.MetadataValue.int(wrote.rows)
                applied[key]["sink_changed"] = dg.MetadataValue.int(wrote.changed)
            if failed is not None:
                raise dg.Failure(
                    description=(
                        f"write-back failed after {len(written)} of {len(refs)} partition(s): "
                        f"{failed}. The labels are applied in the store; the next run, or a "
                        "re-execution of this one, completes the write-back"
                    )
                )
            rows = sum(r.changed for r in written.values())
            context.log.info(f"{sink.name}: {rows} row(s) written or changed")
        # Done at this code version: a no-op `run` skips these without asking the instance.
        with write_tx(engine) as conn:
            partition_marks.mark(conn, [r.mark for r in refs], versions.code_version)
        add_partition_metadata(context, applied, run_keys)
        return dg.MaterializeResult()

    return applied_labels
