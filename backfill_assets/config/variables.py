"""Every environment variable the product reads: its name, type, bounds, default and meaning.

Each is declared once, here, as a field of ``Variables``. ``Settings`` (``settings.py``) adds
what they build; ``docs/configuration.md`` is generated from these declarations
(``config_reference.py``). A variable the ``settings`` or ``checks`` resource also carries is
declared on that resource and only named here (``_from_resource``), so the UI, the parser and
the docs read one description. Variables read outside Python (``bin/*``) or by Dagster itself
are listed in ``ELSEWHERE``, with the same fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import dagster as dg
from pydantic import BeforeValidator, Field, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from backfill_assets.defs.checks_config import ChecksResource
from backfill_assets.defs.resources import RunSettings
from backfill_assets.domain.money.prices import PriceError, PriceTable
from backfill_assets.domain.ranges import MAX_SETTING_SECONDS
from backfill_assets.domain.work.faults import KILL_POINTS
from backfill_assets.ledger.dead_peer import DEFAULT_DEAD_PEER_SECONDS
from backfill_assets.ledger.engine import database_url
from backfill_assets.platform_db.sink import DEFAULT_BATCH as DEFAULT_SINK_BATCH
from backfill_assets.platform_db.sink import DEFAULT_TABLE as DEFAULT_SINK_TABLE
from backfill_assets.platform_db.sink import split_table_name

# Sections of docs/configuration.md, in order, with their titles.
SECTIONS: dict[str, str] = {
    "store": "Store and Dagster instance",
    "model": "Model",
    "http": "Rate limits and HTTP (`BACKFILL_MODEL_BACKEND=openai`)",
    "run": "Run behaviour",
    "orchestration": "Orchestration",
    "batch": "Batch mode",
    "checks": "Checks and the apply",
    "data": "Data in and out ([data.md](data.md))",
    "drills": "Test-only: fault hooks and the fake model's hostile modes",
}


def _flag(value: object) -> object:
    """1/true/yes/on and 0/false/no/off, any case; anything else is not a boolean."""
    if isinstance(value, str):
        raw = value.lower()
        if raw in ("1", "true", "yes", "on"):
            return True
        if raw in ("0", "false", "no", "off"):
            return False
        raise ValueError("is not a boolean")
    return value


Flag = Annotated[bool, BeforeValidator(_flag)]


def _var(name: str, section: str, description: str, *, shown: str = "", **kw: Any) -> Any:
    """A field read from the variable ``name`` (the name errors report), documented in
    ``section``; ``shown`` is the default as the docs say it, when the value alone does not."""
    return Field(
        validation_alias=name,
        description=description,
        json_schema_extra={"section": section, "shown": shown},
        **kw,
    )


def _from_resource(
    name: str,
    section: str,
    resource: type[dg.ConfigurableResource],  # type: ignore[type-arg]
    field: str,
    *,
    unset: bool = False,
    shown: str = "",
) -> Any:
    """A field of ``resource``, read from the variable ``name``: its default, bounds and
    description are declared once, on the resource. ``unset``: the variable defaults to None
    (the resource keeps its own default), and the docs show the resource's default."""
    declared = resource.model_fields[field]
    extra: dict[str, Any] = {"section": section, "shown": shown}
    if unset:
        extra["resource_default"] = declared.default
        return FieldInfo.merge_field_infos(
            declared, validation_alias=name, default=None, json_schema_extra=extra
        )
    return FieldInfo.merge_field_infos(declared, validation_alias=name, json_schema_extra=extra)


@dataclass(frozen=True)
class Documented:
    """A variable read outside ``Variables``: by ``bin/*``, the tests, or Dagster itself."""

    name: str
    section: str
    default: str
    meaning: str
    used_by: str = ""


class Variables(BaseSettings):
    """Every variable the product reads, typed and checked; blank means the default."""

    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", frozen=True)

    # Store and Dagster instance.
    database_url: str = _var(
        "BACKFILL_DATABASE_URL",
        "store",
        "The results/ledger store (SQLAlchemy URL). `postgresql://...` is pinned to psycopg2. "
        "Every command migrates it on first use. On PostgreSQL each store session sets "
        "`random_page_cost` to 1.1 (cached or SSD pages, so a run's group queries use the "
        "tenant indexes) unless it is set for the server, database or role, or in the URL "
        "(`?options=-c%20random_page_cost%3D4`).",
        shown="`sqlite:///$DAGSTER_HOME/backfill.db`",
        default="",
    )
    dagster_home_dir: str = _var(
        "DAGSTER_HOME",
        "store",
        "Dagster instance (runs, events, `dagster.yaml`) and the default store's directory. "
        "The project's `dagster.yaml` (copied into a home without one) keeps Dagster's SQLite "
        "storage with an event log that holds its connections open (`instance_class: "
        "EmbeddedInstance`, "
        "[architecture](architecture.md#one-run-many-partitions-no-work-no-run)).",
        shown="`.dagster_home/` in the project (`bin/prod`: `.dagster_prod/`); an installed "
        "package (a wheel, not a checkout): `$XDG_DATA_HOME/backfill-moderation`",
        default="",
    )
    xdg_data_home: str = _var(
        "XDG_DATA_HOME",
        "store",
        "Only for an installed package without `DAGSTER_HOME`: its Dagster home goes in "
        "`backfill-moderation` under this directory.",
        shown="`~/.local/share`",
        default="",
    )
    pg_dead_peer_seconds: float = _var(
        "BACKFILL_PG_DEAD_PEER_SECONDS",
        "store",
        "PostgreSQL: how soon a peer that went silent (a host that vanished, a cut network) is "
        "given up, on both ends of every connection. It sets each store session's "
        "`tcp_keepalives_idle`/`_interval`/`_count` (5/3/3 at 15) and `tcp_user_timeout` "
        "(PostgreSQL 12+), so the server frees a vanished run's writer and budget locks within "
        "it, and libpq's `keepalives*`, `tcp_user_timeout` and `connect_timeout`, so a cut-off "
        "run fails instead of hanging. The CLI and `bin/prod` add the same to `DAGSTER_PG_URL` "
        "as URL parameters. At least 2; parameters a URL already has win. "
        "[operations.md](operations.md#several-hosts).",
        default=DEFAULT_DEAD_PEER_SECONDS,
        ge=2.0,
        le=86400.0,
    )
    import_dir: str = _from_resource(
        "BACKFILL_IMPORT_DIR",
        "store",
        RunSettings,
        "import_dir",
        shown="the bundled demo export's directory",
    )
    webserver_url: str = _var(
        "DAGSTER_WEBSERVER_URL",
        "store",
        "Where `backfill-moderation launch` finds the webserver (`--url` wins).",
        default="http://127.0.0.1:3000",
    )

    # The model.
    model_backend: Literal["fake", "openai"] = _var(
        "BACKFILL_MODEL_BACKEND",
        "model",
        "`fake` (deterministic, in-process, no network) or `openai` (any OpenAI-compatible "
        "server, [providers.md](providers.md)).",
        default="fake",
    )
    model: str = _var(
        "BACKFILL_MODEL",
        "model",
        "Model name; sent in every request, part of every key and of `moderation_labels`' code "
        "version. Pin a dated snapshot (`gpt-4o-mini-2024-07-18`): an alias that moves changes "
        "the labeller without changing the keys.",
        shown="`fake-moderator-1` (fake), `gpt-4o-mini` (openai)",
        default="",
    )
    model_base_url: str = _var(
        "BACKFILL_MODEL_BASE_URL",
        "model",
        "Default endpoint (tenants without a region); requests go to `{base}/chat/completions`, "
        "batch mode to `{base}/files` and `{base}/batches`.",
        default="https://api.openai.com/v1",
    )
    policy_path: str = _var(
        "BACKFILL_POLICY_PATH",
        "model",
        "The moderation policy file: labels, rules, instructions ([policies.md](policies.md)). "
        "Its identity (id, version, content hash) is part of every key and of the code version. "
        "Read from the environment of the process that loads the definitions, never from run "
        "config.",
        shown="built-in policy (`backfill_assets/policies/default.yaml`)",
        default="",
    )
    policy_min_macro_f1: float | None = _var(
        "BACKFILL_POLICY_MIN_MACRO_F1",
        "model",
        "The evaluation gate: `run` and `launch` exit 2 (and `moderation_labels` refuses) "
        "unless the policy in force, with the model, has a latest `evaluate` macro-F1 of at "
        "least this (0 to 1); the `macro_f1_gate` check shows it "
        "([policies.md](policies.md#evaluation-is-the-new-version-any-good-before-paying-for-the-archive)).",
        default=None,
        ge=0.0,
        le=1.0,
    )
    policy_min_support: int = _var(
        "BACKFILL_POLICY_MIN_SUPPORT",
        "model",
        "The evaluation gate's minimum gold rows per label: with `BACKFILL_POLICY_MIN_MACRO_F1` "
        'set, the gate fails with "not enough gold data" unless the evaluated gold set holds '
        "at least this many rows of every label of the policy. Below five, a perfect score "
        "cannot tell a good policy from a lucky one; raise it for a gate that means more (at "
        "20 rows a perfect recall's 95% lower bound is 0.84).",
        default=5,
        ge=1,
        le=1_000_000,
    )
    prompt_path: str = _var(
        "BACKFILL_PROMPT_PATH",
        "model",
        "Replaced by `BACKFILL_POLICY_PATH`: setting it exits 2 with a message naming "
        "`BACKFILL_POLICY_PATH`.",
        default="",
    )
    max_tokens_param: Literal["max_tokens", "max_completion_tokens"] = _var(
        "BACKFILL_MAX_TOKENS_PARAM",
        "model",
        "`max_completion_tokens` for models that refuse `max_tokens` (OpenAI's reasoning models).",
        default="max_tokens",
    )
    prices_json: str = _var(
        "BACKFILL_PRICES",
        "model",
        "JSON per model, USD per million tokens, read as decimals (never floats), merged over "
        'the built-in list prices: `{"model": {"input": 2.0, "cached_input": 0.5, "output": '
        "8.0}}` (standard tier for all time; `cached_input` and `cache_write` optional, default "
        'the input price), or `{"model": [{"from": "2026-01-01", "standard": {...}, "batch": '
        '{...}, "flex": {...}}, ...]}` (dated entries per tier). Batch and flex default to half '
        "of standard. A call is priced on its day at the tier the answer reports, in whole "
        "nano-dollars (1e-9 USD), rounded once; the event keeps the price it was booked at. A "
        "dated snapshot uses its family's price. With `BACKFILL_MODEL_BACKEND=openai`, a model "
        "with no price is refused at start-up (exit 2), unless `BACKFILL_ALLOW_UNPRICED`. See "
        "[providers.md](providers.md#prices-dated-and-per-tier).",
        shown="built-in table",
        default="",
    )
    prices_path: str = _var(
        "BACKFILL_PRICES_PATH",
        "model",
        "A file holding the same JSON as `BACKFILL_PRICES` (read once at start-up; a table of "
        "dated prices is easier to review in a file). Not both.",
        default="",
    )
    service_tier: Literal["standard", "flex"] = _var(
        "BACKFILL_SERVICE_TIER",
        "model",
        "`flex`: send synchronous requests at OpenAI's flex tier (Batch API prices, slower, "
        "sometimes no capacity; timeouts raised to 900 s). `run --tier flex` sets it for one "
        "command.",
        default="standard",
    )
    flex_fallback: Literal["wait", "standard"] = _var(
        "BACKFILL_FLEX_FALLBACK",
        "model",
        '`standard`: after `BACKFILL_FLEX_FALLBACK_AFTER_SECONDS` of flex answering "resource '
        'unavailable" in a row, send the rest of the run at the standard tier (logged; the '
        "partition's `service_tiers` metadata shows the split). `wait`: keep retrying flex.",
        default="wait",
    )
    flex_fallback_after_s: float = _var(
        "BACKFILL_FLEX_FALLBACK_AFTER_SECONDS",
        "model",
        "How long flex may lack capacity before `BACKFILL_FLEX_FALLBACK=standard` gives up on it.",
        default=600.0,
        gt=0,
        le=MAX_SETTING_SECONDS,
    )
    # A model with no price books $0: refused unless the operator says so, or an invoice for a
    # whole tenant can silently read zero.
    allow_unpriced: Flag = _var(
        "BACKFILL_ALLOW_UNPRICED",
        "model",
        "On: run a model the price table does not know (a self-hosted model you do not bill). "
        "Its usage events book cost *unknown* (`cost_unknown`, with `cost_nanos` 0), and every "
        "report says so instead of $0: `usage` shows `unknown (N calls unpriced)` (or `>= $X` "
        "when only some calls were unpriced), the CSV `unknown`, `tenant_usage` and partition "
        "metadata the same. Off: such a model is refused (exit 2) by what prices or sends "
        "(`run`, `dry-run`, `evaluate`, `launch`, the code location's runs), since every invoice "
        "of it would read zero; commands that only read or write the store (`import`, `tenant`, "
        "`usage`, `verify`, ...) do not ask.",
        default=False,
    )

    # Rate limits and HTTP.
    rpm: int = _var(
        "BACKFILL_RPM",
        "http",
        "The account's requests per minute for this endpoint and model (0: not set). Unset: the "
        "limiter adopts advertised limits, or starts at the first 429 from the rate it had "
        "reached.",
        default=0,
        ge=0,
        le=10**9,
    )
    tpm: int = _var(
        "BACKFILL_TPM",
        "http",
        "The account's tokens per minute, as `BACKFILL_RPM`.",
        default=0,
        ge=0,
        le=10**12,
    )
    share_limit: Flag = _var(
        "BACKFILL_SHARE_LIMIT",
        "http",
        "Share `BACKFILL_RPM`/`BACKFILL_TPM` with every process that uses the same endpoint, "
        "model and key, through the store (`limiter_members`, sql/006): each paces at its "
        "tenants' fair share. Off: each process paces to the full limit "
        "([operations.md](operations.md#one-provider-limit-across-processes)).",
        default=True,
    )
    adaptive: Flag = _var(
        "BACKFILL_ADAPTIVE",
        "http",
        "AIMD on 429s and latency. Off: fixed pacing at the configured limits.",
        default=True,
    )
    trust_limit_headers: Flag = _var(
        "BACKFILL_TRUST_LIMIT_HEADERS",
        "http",
        "Lower the limits to `x-ratelimit-limit-requests` / `-tokens` when the provider "
        "advertises less (never raise them).",
        default=True,
    )
    http_connect_timeout_s: float = _var(
        "BACKFILL_HTTP_CONNECT_TIMEOUT_S",
        "http",
        "Connect timeout, seconds.",
        default=5.0,
        gt=0.0,
        le=MAX_SETTING_SECONDS,
    )
    http_read_timeout_s: float = _var(
        "BACKFILL_HTTP_READ_TIMEOUT_S",
        "http",
        "Between-bytes timeout.",
        default=60.0,
        gt=0.0,
        le=MAX_SETTING_SECONDS,
    )
    http_total_timeout_s: float = _var(
        "BACKFILL_HTTP_TOTAL_TIMEOUT_S",
        "http",
        "Whole-call timeout (waiting for a pooled connection included).",
        default=120.0,
        gt=0.0,
        le=MAX_SETTING_SECONDS,
    )

    # Run behaviour: the ``settings`` resource's fields.
    concurrency: int = _from_resource("BACKFILL_CONCURRENCY", "run", RunSettings, "concurrency")
    tenant_budget_tokens: int = _from_resource(
        "BACKFILL_TENANT_BUDGET_TOKENS", "run", RunSettings, "tenant_budget_tokens"
    )
    max_attempts: int = _from_resource("BACKFILL_MAX_ATTEMPTS", "run", RunSettings, "max_attempts")
    retry_base_seconds: float = _from_resource(
        "BACKFILL_RETRY_BASE_SECONDS", "run", RunSettings, "retry_base_seconds"
    )
    retry_max_seconds: float = _from_resource(
        "BACKFILL_RETRY_MAX_SECONDS", "run", RunSettings, "retry_max_seconds"
    )
    retry_after_max_seconds: float = _from_resource(
        "BACKFILL_RETRY_AFTER_MAX_SECONDS", "run", RunSettings, "retry_after_max_seconds"
    )
    flush_ms: float = _from_resource("BACKFILL_FLUSH_MS", "run", RunSettings, "flush_ms")
    slice_target_posts: int = _from_resource(
        "BACKFILL_SLICE_TARGET_POSTS", "run", RunSettings, "slice_target_posts"
    )

    # Orchestration.
    partitions_per_run: int = _var(
        "BACKFILL_PARTITIONS_PER_RUN",
        "orchestration",
        "Partitions per run in a UI or `launch` backfill (`BackfillPolicy.multi_run`).",
        default=16,
        ge=1,
        le=100_000,
    )
    run_processes: int = _var(
        "BACKFILL_RUN_PROCESSES",
        "orchestration",
        "Processes a CLI `run` may spread a big plan over (0: the cores, at most 4; 1: one "
        "process). Each sends at most `BACKFILL_CONCURRENCY / processes` calls at once; small "
        'runs stay in one process (docs/architecture.md, "A big `run` uses every core").',
        default=0,
        ge=0,
        le=64,
    )
    executor: Literal["in_process", "multiprocess"] = _var(
        "BACKFILL_EXECUTOR",
        "orchestration",
        "`multiprocess` restores Dagster's default executor (a process per step; only the "
        "orchestration benchmark wants it).",
        default="in_process",
    )

    # Batch mode.
    dispatch: Literal["sync", "batch"] = _from_resource(
        "BACKFILL_DISPATCH", "batch", RunSettings, "dispatch"
    )
    batch_max_lines: int = _from_resource(
        "BACKFILL_BATCH_MAX_LINES", "batch", RunSettings, "batch_max_lines"
    )
    batch_poll_seconds: float = _from_resource(
        "BACKFILL_BATCH_POLL_SECONDS", "batch", RunSettings, "batch_poll_seconds"
    )
    batch_max_output_bytes: int = _from_resource(
        "BACKFILL_BATCH_MAX_OUTPUT_BYTES", "batch", RunSettings, "batch_max_output_bytes"
    )
    # The pessimistic reading of the provider's promise: the whole completion window.
    batch_prior_seconds: float = _var(
        "BACKFILL_BATCH_PRIOR_SECONDS",
        "batch",
        "What `run --deadline` assumes a batch takes until this store has completed 3 batches "
        "of the model (then their 90th percentile). The default is the whole 24 h completion "
        "window.",
        default=86_400.0,
        gt=0.0,
        le=7 * MAX_SETTING_SECONDS,
    )
    # OpenAI documents that a cancelled batch stays 'cancelling' for up to 10 minutes.
    batch_cancel_seconds: float = _var(
        "BACKFILL_BATCH_CANCEL_SECONDS",
        "batch",
        "What `run --deadline` assumes a batch cancel takes (from the cancel to `cancelled`, "
        "while lines may still complete and bill) until this store has seen 3 cancels at the "
        "endpoint for the model (then the longest of the newest 20). The plan switches over "
        "that much earlier. The default is the documented bound, 10 minutes.",
        default=600.0,
        ge=0.0,
        le=86_400.0,
    )
    flex_unavailable_prior: float = _var(
        "BACKFILL_FLEX_UNAVAILABLE_PRIOR",
        "batch",
        "What `run --deadline` assumes of flex (with `BACKFILL_SERVICE_TIER=flex` or `--tier "
        "flex`) until this store has sent 100 flex requests under deadline plans: the share "
        "refused for capacity (a refused key is sent again, so flex finishes that share fewer "
        "keys per second).",
        default=0.25,
        ge=0.0,
        le=1.0,
    )
    batch_create_lookup_seconds: float = _from_resource(
        "BACKFILL_BATCH_CREATE_LOOKUP_SECONDS", "batch", RunSettings, "batch_create_lookup_seconds"
    )

    # Checks and the apply: the ``checks`` resource's fields (unset: its default).
    check_max_rebilled_share: float | None = _from_resource(
        "BACKFILL_CHECK_MAX_REBILLED_SHARE",
        "checks",
        ChecksResource,
        "max_rebilled_share",
        unset=True,
    )
    check_max_orphan_attempts: int | None = _from_resource(
        "BACKFILL_CHECK_MAX_ORPHAN_ATTEMPTS",
        "checks",
        ChecksResource,
        "max_orphan_attempts",
        unset=True,
    )
    check_max_tokens_per_key: int | None = _from_resource(
        "BACKFILL_CHECK_MAX_TOKENS_PER_KEY",
        "checks",
        ChecksResource,
        "max_tokens_per_key",
        unset=True,
    )
    check_max_over_bound_calls: int | None = _from_resource(
        "BACKFILL_CHECK_MAX_OVER_BOUND_CALLS",
        "checks",
        ChecksResource,
        "max_over_bound_calls",
        unset=True,
    )
    drift_baseline: str | None = _from_resource(
        "BACKFILL_DRIFT_BASELINE", "checks", ChecksResource, "drift_baseline", unset=True
    )
    drift_labels: str | None = _from_resource(
        "BACKFILL_DRIFT_LABELS",
        "checks",
        ChecksResource,
        "drift_labels",
        unset=True,
        shown="the policy's labels whose action is not `none`",
    )
    drift_factor: float | None = _from_resource(
        "BACKFILL_DRIFT_FACTOR", "checks", ChecksResource, "drift_factor", unset=True
    )
    drift_min_count: int | None = _from_resource(
        "BACKFILL_DRIFT_MIN_COUNT", "checks", ChecksResource, "drift_min_count", unset=True
    )
    apply_live: Flag | None = _from_resource(
        "BACKFILL_APPLY_LIVE", "checks", ChecksResource, "apply_live", unset=True
    )

    # Data in and out; both URLs are secrets: never in a repr.
    sink_url: str = _var(
        "BACKFILL_SINK_URL",
        "data",
        "A database `applied_labels` also writes labels back into "
        "([data.md](data.md#labels-back-into-the-platforms-table)); a secret, never printed "
        "unmasked, never set by run config.",
        default="",
        repr=False,
    )
    sink_table: str = _var(
        "BACKFILL_SINK_TABLE",
        "data",
        "The sink's table (`table` or `schema.table`); `sink ddl` prints its DDL, `sink check` "
        "verifies it.",
        default=DEFAULT_SINK_TABLE,
    )
    sink_batch: int = _var(
        "BACKFILL_SINK_BATCH",
        "data",
        "Rows per write-back transaction.",
        default=DEFAULT_SINK_BATCH,
        ge=1,
        le=100_000,
    )
    source_url: str = _var(
        "BACKFILL_SOURCE_URL",
        "data",
        "A database the `posts` asset imports from instead of a file (any SQLAlchemy URL; "
        "`postgresql://` is pinned to psycopg2 and read through a server-side cursor; a SQLite "
        "file is opened read-only).",
        default="",
        repr=False,
    )
    source_query: str = _var(
        "BACKFILL_SOURCE_QUERY",
        "data",
        "The `SELECT` that returns `tenant_id`, `post_id` and `text` (optionally `region` and "
        "the cursor column): one statement, run in a read-only transaction (what is enforced: "
        "[data.md](data.md#what-a-source-query-can-do)).",
        shown="none (required with the URL)",
        default="",
    )
    source_cursor: str = _var(
        "BACKFILL_SOURCE_CURSOR",
        "data",
        "A column of the query: each import reads only the rows from the last one's high-water "
        "mark's cursor value on (that value again), kept in the store as source `posts_asset`.",
        default="",
    )
    source_schedule: str = _var(
        "BACKFILL_SOURCE_SCHEDULE",
        "data",
        "Cron of the `incremental_import` schedule (shipped stopped; ticks are skipped while no "
        "source is set).",
        default="*/15 * * * *",
    )

    # Crash drills and the fake model's hostile modes: never resource config (faults.py).
    kill_after_usage: int = _var(
        "BACKFILL_KILL_AFTER_USAGE",
        "drills",
        "SIGKILL the process right after the commit that makes the Nth usage event durable "
        "(sync crash drills; 0: off).",
        default=0,
        ge=0,
        le=10**9,
    )
    kill_at: str = _var(
        "BACKFILL_KILL_AT",
        "drills",
        "SIGKILL a batch-mode run the first time it reaches `intent`, `upload`, `create`, "
        "`poll` or `fetch`, or (`run --deadline`) `cancel`: right after the switch-over's "
        "cancels are sent; or (`helper`) every helper process of a `run` over several "
        "processes, as soon as it is forked.",
        shown="off",
        default="",
    )
    fake_latency_ms: float = _var(
        "BACKFILL_FAKE_LATENCY_MS",
        "drills",
        "Fake model: added latency per call.",
        default=0.0,
        ge=0.0,
        le=600_000.0,
    )
    fake_failure_rate: float = _var(
        "BACKFILL_FAKE_FAILURE_RATE",
        "drills",
        "Fake model: share of calls failing retriably, decided by hash(key, attempt).",
        default=0.0,
        ge=0.0,
        le=1.0,
    )
    fake_malformed_rate: float = _var(
        "BACKFILL_FAKE_MALFORMED_RATE",
        "drills",
        "Fake model: share of keys answered malformed, decided by hash(key).",
        default=0.0,
        ge=0.0,
        le=1.0,
    )
    fake_overbill_factor: float = _var(
        "BACKFILL_FAKE_OVERBILL_FACTOR",
        "drills",
        "Fake model: bill the prompt tokens times this (another tokenizer than ours; > 1 can "
        "exceed the reserved bound, which stops the tenant).",
        default=1.0,
        gt=0.0,
        le=1000.0,
    )
    fake_usage_shape: Literal["split", "total", "missing"] = _var(
        "BACKFILL_FAKE_USAGE_SHAPE",
        "drills",
        "Fake model: report usage as `split` (prompt and completion), `total` (total only) or "
        "`missing` (none; the bound is booked).",
        default="split",
    )

    @field_validator("kill_at")
    @classmethod
    def _kill_point_known(cls, value: str) -> str:
        # The points are the drill hooks' own list (faults.KILL_POINTS), not a copy of it.
        if value and value not in KILL_POINTS:
            raise ValueError(f"expected one of {', '.join(KILL_POINTS)}")
        return value

    @field_validator("prompt_path")
    @classmethod
    def _prompt_path_replaced(cls, value: str) -> str:
        if value:
            raise ValueError(
                "no longer read: a policy file replaces the prompt file; name it in "
                "BACKFILL_POLICY_PATH (docs/policies.md)"
            )
        return value

    @field_validator("model_base_url")
    @classmethod
    def _model_url_plain(cls, value: str) -> str:
        return checked_model_url(value)

    @field_validator("database_url")
    @classmethod
    def _database_url_parses(cls, value: str) -> str:
        if not value:
            return value
        url = database_url(value)
        if url.get_backend_name() not in ("sqlite", "postgresql"):
            raise ValueError(f"must be SQLite or PostgreSQL, not {url.get_backend_name()!r}")
        return value

    @field_validator("sink_url", "source_url")
    @classmethod
    def _platform_url_parses(cls, value: str) -> str:
        # Refused at start, as the store's is, rather than in the step that first uses it.
        if value:
            database_url(value)
        return value

    @field_validator("prices_json")
    @classmethod
    def _prices_parse(cls, value: str) -> str:
        try:
            PriceTable.from_json(value)
        except PriceError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("import_dir")
    @classmethod
    def _import_dir_absolute(cls, value: str) -> str:
        # The webserver, its code server and run workers may each start in another directory.
        if value and not Path(value).is_absolute():
            raise ValueError("must be an absolute path")
        return value

    @field_validator("sink_table")
    @classmethod
    def _sink_table_is_a_name(cls, value: str) -> str:
        split_table_name(value)
        return value

    @field_validator("source_schedule")
    @classmethod
    def _cron_parses(cls, value: str) -> str:
        if len(value.split()) != 5:
            raise ValueError("is not a cron schedule (e.g. '*/15 * * * *')")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only what the caller hands in: no ``os.environ`` behind its back, no dotenv."""
        return (init_settings,)


def checked_model_url(value: str) -> str:
    """A model base URL we may send a key to: http(s), a host, no user or password in it (they
    would be printed and stored with the URL, and httpx would send them as Basic auth in
    place of the Bearer key)."""
    try:
        parts = urlsplit(value)
        _ = parts.port  # a port that is not a number raises here
    except ValueError:
        raise ValueError("is not a URL (https://host/v1)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host (https://host/v1)")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ValueError(
            "must not carry a user name or password: the key goes in BACKFILL_MODEL_API_KEY"
        )
    return value


# Read by name elsewhere: the API keys by the adapters at run time (never parsed into
# settings), the rest by Dagster, bin/* or the tests.
ELSEWHERE: tuple[Documented, ...] = (
    Documented(
        "DAGSTER_PG_URL",
        "store",
        "none (required by `bin/prod`)",
        "The production instance's PostgreSQL, read by `deploy/dagster.postgres.yaml`. Must "
        "start with `postgresql+psycopg2://` for the webserver and daemon (a bare "
        "`postgresql://` selects psycopg 3, which is not installed; `bin/prod` refuses it). "
        "`backfill-moderation` pins a bare URL to psycopg2 itself, and exits 2 naming "
        "`DAGSTER_HOME` (password redacted) when the instance cannot be opened. Both add the "
        "keepalive parameters of `BACKFILL_PG_DEAD_PEER_SECONDS` the URL lacks ([what Dagster "
        "lets a URL set](operations.md#the-dagster-instances-connections)).",
    ),
    Documented(
        "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS",
        "store",
        "set by `run`",
        "Not a setting: `backfill-moderation run` sets it to 1 around its own runs (one planned "
        "event per asset instead of per partition) and restores it after.",
    ),
    Documented(
        "DAGSTER_EVENT_BATCH_SIZE",
        "store",
        "1000 in `run`",
        "Dagster's own: on PostgreSQL, a step's materialisations are written in batches of this "
        "many. `run` sets 1000 around its runs unless you set a value (0 turns batching off). "
        "`bin/prod` sets the same default for its run workers. A process killed mid-step loses "
        "that step's unwritten events, never the store's work; the next `run` plans those "
        "partitions again.",
    ),
    Documented(
        "BACKFILL_MODEL_API_KEY",
        "model",
        "none",
        "Bearer token of the default endpoint. Wired as `dg.EnvVar`: resolved in the run "
        "process at run time, never in run config, the UI, the ledger, dead letters or logs. "
        "Unset: no `Authorization` header (local servers).",
    ),
    Documented(
        "BACKFILL_MODEL_BASE_URL__<REGION>",
        "model",
        "none",
        "Endpoint of region `<REGION>` (upper case, `-` as `_`: region `us-east` is "
        "`BACKFILL_MODEL_BASE_URL__US_EAST`). A tenant with a region (`tenant set-region`) is "
        "sent only there; a region without a URL fails closed (its keys stay pending, never "
        "sent to another region).",
    ),
    Documented(
        "BACKFILL_MODEL_API_KEY__<REGION>",
        "model",
        "none",
        "That region's key, read by name in the run process at run time; no other endpoint's "
        "key is ever sent to a region's URL.",
    ),
    Documented(
        "`HOST`, `PORT`",
        "processes",
        "`127.0.0.1`, `3000`",
        "Webserver address.",
        "`bin/dev`, `bin/prod`",
    ),
    Documented(
        "STOP_GRACE_SECONDS",
        "processes",
        "8 (`bin/dev`), 30 (`bin/prod`)",
        "After SIGTERM to its children, how long a stop waits before SIGKILL.",
        "`bin/dev`, `bin/prod`",
    ),
    Documented(
        "PYTHON",
        "processes",
        "`python3.11`, else `python3`",
        "The interpreter `.venv/` is created with.",
        "`bin/_venv.sh`",
    ),
    Documented(
        "CI",
        "processes",
        "unset",
        "`true`: PostgreSQL tests fail instead of skipping when the database is unreachable.",
        "`bin/test`, `.ci/run`",
    ),
    Documented(
        "BACKFILL_TEST_PG_URL",
        "processes",
        "`postgresql+psycopg2://postgres@127.0.0.1:5432/postgres`",
        "Server the `pg` tests create their throw-away databases on.",
        "tests, benchmarks",
    ),
)
