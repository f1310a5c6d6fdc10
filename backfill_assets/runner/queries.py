"""The ledger queries behind the CLI's reading and bookkeeping commands (``tenant``,
``rejects``, ``export``, ``usage``, ``requeue``, ``migrate``, ``dry-run``, the deadline plan's
rows): SQLAlchemy only, neither Dagster nor the provider stack, so those commands start fast.
Running work goes through ``api``.
"""

from __future__ import annotations

from backfill_assets.config.urls import database_url
from backfill_assets.ingest.baselines import (
    BaselineSummary,
    baseline_options,
    import_baseline_file,
    import_baseline_query,
)
from backfill_assets.ingest.decisions import DecisionOptions, import_decision_files
from backfill_assets.ingest.decisions import parse_map as parse_decision_map
from backfill_assets.ledger.decisions.baselines import (
    against_baseline,
    baseline_names,
    baseline_tenants,
    moved_posts,
)
from backfill_assets.ledger.decisions.review import REASONS as REVIEW_REASONS
from backfill_assets.ledger.decisions.review import ReviewQueue, review_rows
from backfill_assets.ledger.decisions.store import DecisionsSummary
from backfill_assets.ledger.engine import read_tx, write_tx
from backfill_assets.ledger.engines import engine_for, store_engine
from backfill_assets.ledger.evaluations import CustomerTenant
from backfill_assets.ledger.labels.export import LabelRow, tenant_labels
from backfill_assets.ledger.migrate import migrate, schema_versions
from backfill_assets.ledger.reports import tenant_ids
from backfill_assets.ledger.run.dead_letters import requeue
from backfill_assets.ledger.run.posts import ImportSummary, slice_levels
from backfill_assets.ledger.run.rejects import list_rejects, reject_sources, rejected_tenant_values
from backfill_assets.ledger.run.submissions import ChunkState, state_counts
from backfill_assets.ledger.run.tenants import all_regions, set_region, tenant_rows
from backfill_assets.ledger.run.usage import (
    ledger_by_model_day,
    usage_by_day,
    usage_by_tenant_model,
)
from backfill_assets.ledger.spend.budget import budget_status, set_caps, tenant_caps
from backfill_assets.ledger.spend.deadline_plans import StoredPlan, create_plan, mark, open_plan
from backfill_assets.ledger.spend.estimate import estimate_pending
from backfill_assets.platform_db.decision_source import import_decision_sql
from backfill_assets.platform_db.source import SourceError, query_columns, stream_rows

__all__ = [
    "REVIEW_REASONS",
    "BaselineSummary",
    "ChunkState",
    "CustomerTenant",
    "DecisionOptions",
    "DecisionsSummary",
    "ImportSummary",
    "LabelRow",
    "ReviewQueue",
    "SourceError",
    "StoredPlan",
    "against_baseline",
    "all_regions",
    "baseline_names",
    "baseline_options",
    "baseline_tenants",
    "budget_status",
    "create_plan",
    "database_url",
    "engine_for",
    "estimate_pending",
    "import_baseline_file",
    "import_baseline_query",
    "import_decision_files",
    "import_decision_sql",
    "ledger_by_model_day",
    "list_rejects",
    "mark",
    "migrate",
    "moved_posts",
    "open_plan",
    "parse_decision_map",
    "query_columns",
    "read_tx",
    "reject_sources",
    "rejected_tenant_values",
    "requeue",
    "review_rows",
    "schema_versions",
    "set_caps",
    "set_region",
    "slice_levels",
    "state_counts",
    "store_engine",
    "stream_rows",
    "tenant_caps",
    "tenant_ids",
    "tenant_labels",
    "tenant_rows",
    "usage_by_day",
    "usage_by_tenant_model",
    "write_tx",
]
