"""SQLAlchemy Core mirrors of the tables created by ``sql/`` (a test keeps them in step)."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa

metadata = sa.MetaData()


def utcnow() -> datetime:
    """Naive UTC, stored the same way by both stores."""
    return datetime.now(UTC).replace(tzinfo=None)


tenants = sa.Table(
    "tenants",
    metadata,
    sa.Column("tenant_id", sa.Text, primary_key=True),
    sa.Column("region", sa.Text),
    sa.Column("billed_tokens", sa.BigInteger, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    # sql/007: 2^slice_level of the tenant's partitions hold posts (NULL: all of them).
    sa.Column("slice_level", sa.Integer),
    # sql/011: NULL for a customer's tenant; 'evaluation' for one that holds gold sets.
    sa.Column("purpose", sa.Text),
    # sql/015: the tenant's caps (NULL: none) and the cost of its usage events, in nano-dollars.
    sa.Column("budget_tokens", sa.BigInteger),
    sa.Column("budget_nanos", sa.BigInteger),
    sa.Column("billed_nanos", sa.BigInteger, nullable=False),
)

posts = sa.Table(
    "posts",
    metadata,
    sa.Column("tenant_id", sa.Text, primary_key=True),
    sa.Column("post_id", sa.Text, primary_key=True),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("content_hash", sa.Text, nullable=False),
    sa.Column("slice", sa.Integer, nullable=False),
    sa.Column("imported_at", sa.DateTime, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
    # sql/002: labels applied by applied_labels (live pair, then the shadow pair).
    sa.Column("moderation_label", sa.Text),
    sa.Column("moderation_rubric_version", sa.Text),
    sa.Column("moderation_label_shadow", sa.Text),
    sa.Column("moderation_rubric_version_shadow", sa.Text),
)

rejected_records = sa.Table(
    "rejected_records",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("line", sa.Integer, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("tenant_given", sa.Text),
    sa.Column("at", sa.DateTime, nullable=False),
    # sql/010: where the row is when a line number alone does not say (Parquet, a query).
    sa.Column("locator", sa.Text),
)

results = sa.Table(
    "results",
    metadata,
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("tenant_id", sa.Text, nullable=False),
    sa.Column("post_id", sa.Text, nullable=False),
    sa.Column("slice", sa.Integer, nullable=False),
    sa.Column("content_hash", sa.Text, nullable=False),
    sa.Column("label", sa.Text, nullable=False),
    sa.Column("confidence", sa.Float, nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    # The policy's key version (docs/policies.md); the name is from before policy files.
    sa.Column("key_version", sa.Text, nullable=False),
    sa.Column("task_version", sa.Text, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    # sql/009: the rules that matched, comma-joined ('' for none).
    sa.Column("rule_ids", sa.Text, nullable=False),
    # sql/022: the chosen label's probability from the wire (NULL: none was given), and in a
    # mapped dialect the answer as returned and the section's hash it was read under.
    sa.Column("p_label", sa.Float),
    sa.Column("raw_result", sa.Text),
    sa.Column("mapping", sa.Text),
    # sql/024: the cascade stage that decided a cascade's label (NULL elsewhere).
    sa.Column("stage", sa.Text),
)

ledger_events = sa.Table(
    "ledger_events",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
    sa.Column("tenant_id", sa.Text, nullable=False),
    sa.Column("key", sa.Text, nullable=False),
    sa.Column("attempt_id", sa.Text, nullable=False),
    sa.Column("attempt_no", sa.Integer, nullable=False),
    sa.Column("type", sa.Text, nullable=False),
    sa.Column("slice", sa.Integer, nullable=False),
    sa.Column("post_id", sa.Text),
    sa.Column("content_hash", sa.Text),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("key_version", sa.Text),
    sa.Column("task_version", sa.Text),
    sa.Column("tokens_in", sa.BigInteger, nullable=False),
    sa.Column("tokens_out", sa.BigInteger, nullable=False),
    sa.Column("cost_nanos", sa.BigInteger, nullable=False),
    sa.Column("request_id", sa.Text),
    sa.Column("status", sa.Integer),
    sa.Column("message", sa.Text),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("at", sa.DateTime, nullable=False),
    # sql/004: 'split' | 'total' | 'missing' on usage events, and the call's reserved bound.
    sa.Column("usage_shape", sa.Text),
    sa.Column("bound_tokens", sa.BigInteger),
    sa.Column("tokens_cached", sa.BigInteger, nullable=False),
    sa.Column("tokens_cache_written", sa.BigInteger, nullable=False),
    # sql/014: the tier the provider billed, and the price booked (JSON of core.prices).
    sa.Column("service_tier", sa.Text),
    sa.Column("price_booked", sa.Text),
    sa.Column("cost_unknown", sa.SmallInteger, nullable=False),
    sa.Column("tokens_reasoning", sa.BigInteger, nullable=False),
)

dead_letters = sa.Table(
    "dead_letters",
    metadata,
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("tenant_id", sa.Text, nullable=False),
    sa.Column("post_id", sa.Text, nullable=False),
    sa.Column("slice", sa.Integer, nullable=False),
    sa.Column("content_hash", sa.Text, nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("key_version", sa.Text, nullable=False),
    sa.Column("task_version", sa.Text, nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("at", sa.DateTime, nullable=False),
)

budget_reservations = sa.Table(
    "budget_reservations",
    metadata,
    sa.Column("reservation_id", sa.Text, primary_key=True),
    sa.Column("tenant_id", sa.Text, nullable=False),
    sa.Column("tokens", sa.BigInteger, nullable=False),
    sa.Column("holder", sa.Text, nullable=False),
    sa.Column("heartbeat_at", sa.DateTime, nullable=False),
    # sql/015: the dollar half of the reservation.
    sa.Column("nanos", sa.BigInteger, nullable=False),
)

# sql/003: Batch API submissions and their lines (BACKFILL_DISPATCH=batch).
batch_submissions = sa.Table(
    "batch_submissions",
    metadata,
    sa.Column("chunk_id", sa.Text, primary_key=True),
    sa.Column("chunk_base", sa.Text, nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("tenant_id", sa.Text, nullable=False),
    sa.Column("slice", sa.Integer, nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("key_version", sa.Text, nullable=False),
    sa.Column("task_version", sa.Text, nullable=False),
    sa.Column("lines", sa.Integer, nullable=False),
    sa.Column("file_sha256", sa.Text, nullable=False),
    sa.Column("file_bytes", sa.BigInteger, nullable=False),
    sa.Column("file_id", sa.Text),
    sa.Column("batch_id", sa.Text),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("provider_status", sa.Text),
    sa.Column("output_file_id", sa.Text),
    sa.Column("error_file_id", sa.Text),
    sa.Column("requests_total", sa.Integer, nullable=False),
    sa.Column("requests_completed", sa.Integer, nullable=False),
    sa.Column("requests_failed", sa.Integer, nullable=False),
    sa.Column("reserved_tokens", sa.BigInteger, nullable=False),
    sa.Column("errors", sa.Text),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("intent_at", sa.DateTime, nullable=False),
    sa.Column("submitted_at", sa.DateTime),
    sa.Column("finished_at", sa.DateTime),
    sa.Column("booked_at", sa.DateTime),
    # sql/005: a create was sent whose outcome may be unknown (no second create until found
    # or the lookup window passed); reserved_tokens is the chunk's live reservation.
    sa.Column("create_sent_at", sa.DateTime),
    # sql/015: the dollar half of the chunk's live reservation, in nano-dollars.
    sa.Column("reserved_nanos", sa.BigInteger, nullable=False),
)

batch_lines = sa.Table(
    "batch_lines",
    metadata,
    sa.Column("chunk_id", sa.Text, primary_key=True),
    sa.Column("line_no", sa.Integer, primary_key=True),
    sa.Column("key", sa.Text, nullable=False),
    sa.Column("tenant_id", sa.Text, nullable=False),
    sa.Column("slice", sa.Integer, nullable=False),
    sa.Column("post_id", sa.Text, nullable=False),
    sa.Column("content_hash", sa.Text, nullable=False),
    sa.Column("attempt_no", sa.Integer, nullable=False),
    # sql/005: the most tokens the line's request can bill (reserved, and booked if no usage).
    sa.Column("bound_tokens", sa.BigInteger),
    # sql/015: the most nano-dollars it can cost at the batch price (NULL: recorded before).
    sa.Column("bound_nanos", sa.BigInteger),
)

limiter_members = sa.Table(
    "limiter_members",
    metadata,
    sa.Column("endpoint", sa.Text, primary_key=True),
    sa.Column("member", sa.Text, primary_key=True),
    sa.Column("weight", sa.Float, nullable=False),
    sa.Column("heartbeat_at", sa.Float, nullable=False),
)

# sql/008: usage per tenant, model and UTC day, kept in the usage events' own transaction.
usage_daily = sa.Table(
    "usage_daily",
    metadata,
    sa.Column("tenant_id", sa.Text, primary_key=True),
    sa.Column("model", sa.Text, primary_key=True),
    sa.Column("day", sa.Text, primary_key=True),
    sa.Column("calls", sa.BigInteger, nullable=False),
    sa.Column("tokens_in", sa.BigInteger, nullable=False),
    sa.Column("tokens_out", sa.BigInteger, nullable=False),
    sa.Column("cost_nanos", sa.BigInteger, nullable=False),
    # sql/014: of tokens_in, read from the provider's prompt cache; calls with no price.
    sa.Column("tokens_cached", sa.BigInteger, nullable=False),
    sa.Column("calls_cost_unknown", sa.BigInteger, nullable=False),
)

# sql/009: every policy version the store worked under, and the label in force per policy.
policy_versions = sa.Table(
    "policy_versions",
    metadata,
    sa.Column("key_version", sa.Text, primary_key=True),
    sa.Column("policy_id", sa.Text, nullable=False),
    sa.Column("version", sa.Text, nullable=False),
    sa.Column("identity", sa.Text, nullable=False),
    sa.Column("content_hash", sa.Text, nullable=False),
    sa.Column("document", sa.Text, nullable=False),
    sa.Column("registered_at", sa.DateTime, nullable=False),
)

applied_labels = sa.Table(
    "applied_labels",
    metadata,
    sa.Column("tenant_id", sa.Text, primary_key=True),
    sa.Column("post_id", sa.Text, primary_key=True),
    sa.Column("policy_id", sa.Text, primary_key=True),
    sa.Column("label", sa.Text, nullable=False),
    sa.Column("rule_ids", sa.Text, nullable=False),
    sa.Column("policy_version", sa.Text, nullable=False),
    sa.Column("key_version", sa.Text, nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("result_key", sa.Text, nullable=False),
    sa.Column("content_hash", sa.Text, nullable=False),
    sa.Column("applied_at", sa.DateTime, nullable=False),
    # sql/025: 'model' or 'human' (ledger/decisions/tables.py).
    sa.Column("source", sa.Text, nullable=False, server_default="model"),
)

# sql/010: the high-water mark of each database source (`import --sql --source NAME`).
import_sources = sa.Table(
    "import_sources",
    metadata,
    sa.Column("source", sa.Text, primary_key=True),
    sa.Column("cursor_column", sa.Text),
    sa.Column("cursor_value", sa.Text),
    sa.Column("cursor_tenant_id", sa.Text),
    sa.Column("cursor_post_id", sa.Text),
    sa.Column("rows_read", sa.BigInteger, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
)

# sql/011: gold-set evaluations of policy versions.
policy_evaluations = sa.Table(
    "policy_evaluations",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
    sa.Column("key_version", sa.Text, nullable=False),
    sa.Column("identity", sa.Text, nullable=False),
    sa.Column("policy_id", sa.Text, nullable=False),
    sa.Column("version", sa.Text, nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("tenant_id", sa.Text, nullable=False),
    sa.Column("gold_source", sa.Text, nullable=False),
    sa.Column("gold_sha256", sa.Text, nullable=False),
    sa.Column("gold_rows", sa.Integer, nullable=False),
    sa.Column("accuracy", sa.Float, nullable=False),
    sa.Column("macro_f1", sa.Float, nullable=False),
    sa.Column("schema_rejected_share", sa.Float, nullable=False),
    sa.Column("report", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    # sql/023: the folder `evaluate --report` wrote the pictures to (NULL: none written).
    sa.Column("report_dir", sa.Text),
)

# sql/016: each partition's write-back into the platform's table, per sink.
sink_writes = sa.Table(
    "sink_writes",
    metadata,
    sa.Column("sink_id", sa.Text, primary_key=True),
    sa.Column("tenant_id", sa.Text, primary_key=True),
    sa.Column("slice", sa.Integer, primary_key=True),
    sa.Column("key_version", sa.Text, primary_key=True),
    sa.Column("rows_written", sa.BigInteger, nullable=False),
    sa.Column("applied_through", sa.DateTime),
    sa.Column("written_at", sa.DateTime, nullable=False),
)

# sql/017: partitions done (materialised, checked, applied) at a code version.
partition_marks = sa.Table(
    "partition_marks",
    metadata,
    sa.Column("tenant_id", sa.Text, primary_key=True),
    sa.Column("partition", sa.Integer, primary_key=True),
    sa.Column("level", sa.Integer, nullable=False),
    sa.Column("code_version", sa.Text, nullable=False),
    sa.Column("marked_at", sa.DateTime, nullable=False),
)

# sql/018: a deadline plan being carried out, with its deadline and switch-over.
deadline_plans = sa.Table(
    "deadline_plans",
    metadata,
    sa.Column("plan_id", sa.Text, primary_key=True),
    sa.Column("code_version", sa.Text, nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("deadline", sa.DateTime, nullable=False),
    sa.Column("switch_over", sa.DateTime),
    sa.Column("plan_json", sa.Text, nullable=False),
    sa.Column("submitted_at", sa.DateTime),
    sa.Column("switched_at", sa.DateTime),
    sa.Column("finished_at", sa.DateTime),
    sa.Column("flex_calls", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("flex_refused", sa.BigInteger, nullable=False, server_default="0"),
)

# sql/020: how long each batch cancel took, per Batch API endpoint and model.
batch_cancels = sa.Table(
    "batch_cancels",
    metadata,
    sa.Column("batch_id", sa.Text, primary_key=True),
    sa.Column("endpoint", sa.Text, nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("seconds", sa.Float, nullable=False),
    sa.Column("ended_at", sa.DateTime, nullable=False),
)

# sql/025 (issue 50): the two values of ``applied_labels.source``, moderators' decisions and
# previous classifiers' baselines.
HUMAN = "human"
MODEL = "model"

decisions = sa.Table(
    "decisions",
    metadata,
    sa.Column("decision_key", sa.Text, primary_key=True),
    sa.Column("tenant_id", sa.Text, nullable=False),
    sa.Column("post_id", sa.Text, nullable=False),
    sa.Column("policy_id", sa.Text, nullable=False),
    sa.Column("policy_version", sa.Text, nullable=False),
    sa.Column("key_version", sa.Text, nullable=False),
    sa.Column("label", sa.Text, nullable=False),
    sa.Column("rule_ids", sa.Text, nullable=False),
    sa.Column("reviewer_id", sa.Text, nullable=False),
    sa.Column("decided_at", sa.DateTime, nullable=False),
    sa.Column("reason_code", sa.Text, nullable=True),
    sa.Column("content_hash", sa.Text, nullable=False),
    sa.Column("imported_at", sa.DateTime, nullable=False),
)

baselines = sa.Table(
    "baselines",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("tenant_id", sa.Text, primary_key=True),
    sa.Column("post_id", sa.Text, primary_key=True),
    sa.Column("policy_id", sa.Text, nullable=False),
    sa.Column("label", sa.Text, nullable=False),
    sa.Column("scores", sa.Text, nullable=True),
    sa.Column("content_hash", sa.Text, nullable=False),
    sa.Column("imported_at", sa.DateTime, nullable=False),
)
