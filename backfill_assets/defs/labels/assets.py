"""The moderation labels asset (thin: orchestration only); ``posts`` is in posts_asset.py."""

import warnings

import dagster as dg

from backfill_assets.config.variables import StoreSettings
from backfill_assets.defs.asset_keys import LABELS, POSTS
from backfill_assets.defs.instance_api import add_partition_metadata
from backfill_assets.defs.labels.metadata import partition_metadata
from backfill_assets.defs.model_resources import (
    CascadeModelResource,
    ModelResource,
    run_versions,
    stage_runs,
)
from backfill_assets.defs.partitions import moderation_partitions, run_refs
from backfill_assets.defs.reporting.evaluation import gate_result
from backfill_assets.defs.resources import RunResource
from backfill_assets.defs.sealing import NO_CONFIG
from backfill_assets.dispatch.cascade_run import run_cascade
from backfill_assets.dispatch.partition_run import RunStopped
from backfill_assets.dispatch.pipeline import run_partitions, with_levels
from backfill_assets.domain.policy.evaluation import Gate
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.domain.work.faults import NO_FAULTS, FaultHooks
from backfill_assets.ledger.engine import read_tx, write_tx
from backfill_assets.ledger.engines import store_engine
from backfill_assets.ledger.locks.fence import LockLost
from backfill_assets.ledger.reports import partition_spend
from backfill_assets.ledger.run import partition_marks
from backfill_assets.ledger.run.partition_groups import grouped, owners_of_all


def build_moderation_labels(
    rubric: Rubric,
    code_version: str,
    partitions_per_run: int,
    faults: FaultHooks = NO_FAULTS,
    gate: Gate | None = None,
) -> dg.AssetsDefinition:
    """The labels asset; its code version names the task, the policy and the model.

    The policy (``rubric``) and ``faults`` (crash drills) come from the environment and are
    closed over here, so no launchpad config can change them. ``gate``
    (``BACKFILL_POLICY_MIN_MACRO_F1``): a step under a policy without a passing evaluation
    fails before it sends anything, however it was launched.
    """
    with warnings.catch_warnings():
        # BackfillPolicy is "beta" in Dagster 1.13; the warning is noise on every CLI call.
        warnings.simplefilter("ignore", dg.BetaWarning)
        return _labels_asset(rubric, code_version, partitions_per_run, faults, gate)


def _labels_asset(
    rubric: Rubric,
    code_version: str,
    partitions_per_run: int,
    faults: FaultHooks,
    gate: Gate | None,
) -> dg.AssetsDefinition:
    @dg.asset(
        config_schema=NO_CONFIG,
        key=LABELS,
        partitions_def=moderation_partitions,
        code_version=code_version,
        backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=partitions_per_run),
        deps=[POSTS],
        group_name="moderation",
        kinds={"python", "sql"},
        tags={"llm": "moderation"},
    )
    def moderation_labels(
        context: dg.AssetExecutionContext,
        store: dg.ResourceParam[StoreSettings],
        model: dg.ResourceParam[ModelResource],
        settings: dg.ResourceParam[RunResource],
    ) -> dg.MaterializeResult[None]:
        """LLM moderation labels per tenant slice; re-runs only send unfinished keys."""
        run_keys = context.partition_keys
        refs = run_refs(run_keys)
        # The policy the definitions loaded: the keys and the requests use the same text.
        versions = run_versions(model, rubric, code_version)
        if gate is not None:
            check_result = gate_result(store_engine(store), rubric, versions.model, gate)
            if not check_result.passed:
                raise dg.Failure(description=check_result.summary, allow_retries=False)
        # Which stored slices each partition holds depends on its tenant's slice level.
        refs = with_levels(store_engine(store), refs)
        context.log.info(f"{len(refs)} partition(s), {versions.code_version}")
        # Not done until this materialisation is checked and applied (partition_marks.py).
        with write_tx(store_engine(store)) as conn:
            partition_marks.clear(conn, [r.mark for r in refs])
        stopped: RunStopped | None = None
        try:
            if isinstance(model, CascadeModelResource):
                reports = run_cascade(
                    store_engine(store),
                    refs,
                    stage_runs(model),
                    versions,
                    rubric,
                    context.run.run_id,
                    settings.run_options(None, faults),
                    log=context.log.info,
                )
            else:
                reports = run_partitions(
                    store_engine(store),
                    refs,
                    model.build_adapter,
                    versions,
                    rubric,
                    context.run.run_id,
                    settings.run_options(model, faults),
                    log=context.log.info,
                )
        except RunStopped as exc:
            stopped, reports = exc, exc.reports
        except LockLost as exc:
            # The run's failure says which partitions were taken over (nothing more of them
            # was committed); retrying here could only find them taken.
            raise dg.Failure(description=str(exc), allow_retries=False) from exc
        # A partition that holds no stored slice has billed nothing.
        spend = {r.ref.key: {"billed_tokens": 0, "rebilled_tokens": 0} for r in reports}
        with read_tx(store_engine(store)) as conn:
            for group in grouped(reports, lambda r: r.posts):
                spend.update(partition_spend(conn, owners_of_all(r.ref for r in group)))
        add_partition_metadata(
            context,
            {r.ref.key: partition_metadata(r, versions, rubric, spend[r.ref.key]) for r in reports},
            run_keys,
        )
        if stopped is not None:
            # A run-level error (wrong key, permission, model, URL): nothing more was sent and
            # every key left is pending, so the next run with the fix completes them.
            raise dg.Failure(description=str(stopped), allow_retries=False)
        busy = [r.ref.key for r in reports if r.busy]
        if busy:
            raise dg.Failure(
                description=f"{len(busy)} partition(s) are being written by another run: "
                + ", ".join(busy[:10]),
                allow_retries=True,
            )
        return dg.MaterializeResult()

    return moderation_labels
