"""The runner's one entry for the CLI: what ``run`` does (``run_work``, ``plan_progress``), and
the runner's, definitions' and readers' names that ``launch``, ``import``, ``verify``,
``evaluate``, ``check``, the deadline plan and the canary use, handed on from their modules.

The CLI imports this module when a command that runs work is chosen, never at start-up: it
brings in Dagster and the provider stack. The ledger queries that need neither are
``queries``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import dagster as dg

from backfill_assets.defs.asset_keys import BLOCKING_GROUPS, POLICY_EVALUATION
from backfill_assets.defs.instance_api import CHECK_STATES
from backfill_assets.defs.labels.applied import write_back
from backfill_assets.defs.labels.checks import check_results_for, check_status
from backfill_assets.defs.model_resources import (
    OpenAIModelResource,
    model_resource,
    stage_models,
    versions_for,
)
from backfill_assets.defs.partitions import ensure_partitions, partition_key_for, partition_ref
from backfill_assets.defs.reporting.cascade_sweep import sweep_cascade
from backfill_assets.defs.reporting.evaluation import (
    comparison,
    evaluate_policies,
    evaluation_metadata,
    gate_evaluation,
    gate_result,
    gold_sha256,
    store_gold,
)
from backfill_assets.defs.reporting.evaluation_report import (
    AGAINST,
    ReportDirError,
    check_report_dir,
    write_frontier,
    write_report,
)
from backfill_assets.defs.reporting.usage import REPRICE_COLUMNS, USAGE_COLUMNS, reprice, usage_csv
from backfill_assets.defs.resources import RunResource
from backfill_assets.demo.generate import write_export
from backfill_assets.dispatch.partition_run import PartitionRef, RunStopped
from backfill_assets.dispatch.pipeline import run_partitions, with_levels
from backfill_assets.ingest.gold import GoldError, read_decided_gold, read_gold
from backfill_assets.ingest.importer import (
    ImportInputError,
    ImportOptions,
    export_files,
    import_files,
)
from backfill_assets.ledger.engine import read_tx
from backfill_assets.ledger.run.posts import slice_levels
from backfill_assets.ledger.run.tenants import all_regions
from backfill_assets.platform_db.sink import SinkError, check, ddl, gap_partitions, sink_of
from backfill_assets.platform_db.sql_import import SqlImport, SqlSource, import_sql
from backfill_assets.runner.canary import run_sample
from backfill_assets.runner.deadline_plan import NoLimitKnown, NoTiersToMix, plan_deadline
from backfill_assets.runner.deadline_run import carry_out, utc
from backfill_assets.runner.instance import instance
from backfill_assets.runner.launch import (
    DONE_STATUSES,
    DagsterClient,
    GraphQLError,
    by_tenant,
    select_partitions,
)
from backfill_assets.runner.orchestrate import record_import, refresh
from backfill_assets.runner.plan import make_plan
from backfill_assets.runner.pooling import Plan, pool_by_region
from backfill_assets.runner.processes import SharedRun, run_plan
from backfill_assets.runner.run_records import RunRecord
from backfill_assets.runner.verify import verify_store
from backfill_assets.wiring import PLAN_JOB, USAGE_JOB, build_definitions

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from backfill_assets.config.settings import Settings

__all__ = [
    "AGAINST",
    "BLOCKING_GROUPS",
    "CHECK_STATES",
    "DONE_STATUSES",
    "POLICY_EVALUATION",
    "REPRICE_COLUMNS",
    "USAGE_COLUMNS",
    "DagsterClient",
    "GoldError",
    "GraphQLError",
    "ImportInputError",
    "ImportOptions",
    "NoLimitKnown",
    "NoTiersToMix",
    "OpenAIModelResource",
    "PartitionRef",
    "Plan",
    "ReportDirError",
    "RunRecord",
    "RunResource",
    "RunStopped",
    "SinkError",
    "SqlImport",
    "SqlSource",
    "by_tenant",
    "carry_out",
    "check",
    "check_report_dir",
    "check_results_for",
    "check_status",
    "comparison",
    "ddl",
    "ensure_partitions",
    "evaluate_policies",
    "evaluation_metadata",
    "export_files",
    "gap_partitions",
    "gate_evaluation",
    "gate_result",
    "gold_sha256",
    "import_files",
    "import_sql",
    "instance",
    "make_plan",
    "model_resource",
    "partition_key_for",
    "partition_ref",
    "plan_deadline",
    "plan_progress",
    "read_decided_gold",
    "read_gold",
    "record_import",
    "reprice",
    "run_partitions",
    "run_sample",
    "run_work",
    "select_partitions",
    "sink_of",
    "stage_models",
    "store_gold",
    "sweep_cascade",
    "usage_csv",
    "utc",
    "verify_store",
    "versions_for",
    "with_levels",
    "write_back",
    "write_export",
    "write_frontier",
    "write_report",
]


def run_work(
    settings: Settings,
    engine: Engine,
    tenants: list[str],
    slices: list[int] | None,
    *,
    force: bool,
    restrict: bool,
) -> SharedRun:
    """What ``run`` does: the partitions with work of ``tenants`` (every tenant unless
    ``restrict``; every slice unless ``slices``) through Dagster: labels, checks, the gated
    apply. Only partitions with something to do reach Dagster (``force``: every partition that
    holds posts), pooled into few runs, one region each, spread over the cores when the plan is
    big; the usage view is refreshed after a run that did something. An interrupted run comes
    back with ``interrupted`` set, its finished work committed."""
    defs, inst = build_definitions(settings), instance(settings)
    with read_tx(engine) as conn:
        levels = slice_levels(conn, tenants)
    order = ensure_partitions(inst, levels)
    sink = sink_of(settings.data)
    plan = make_plan(
        engine,
        inst,
        settings.versions(),
        tenants if restrict else None,
        slices,
        force=force,
        sink_id=None if sink is None else sink.sink_id,
        order=order,
    )
    with read_tx(engine) as conn:
        regions = all_regions(conn)
    # One region per run: a region without an endpoint here fails only its own runs, and
    # each run carries its region's tag for the run queue.
    plan = pool_by_region(plan, order, regions)
    # A big plan spreads over the cores (processes.py); a small one runs here.
    shared = run_plan(settings, defs, inst, plan, regions)
    if shared.records and not shared.interrupted:
        refresh(defs, inst, USAGE_JOB)  # tenant_usage shows this run's spend at once
    return shared


def plan_progress(settings: Settings) -> Callable[[], bool]:
    """A deadline plan's progress for the UI: refreshes ``backfill_plan`` after each step,
    the definitions and the instance built at the first."""
    built: list[tuple[dg.Definitions, dg.DagsterInstance]] = []

    def show() -> bool:
        if not built:
            built.append((build_definitions(settings), instance(settings)))
        return refresh(*built[0], PLAN_JOB)

    return show
