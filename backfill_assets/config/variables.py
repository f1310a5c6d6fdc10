"""Every environment variable the product reads: its name, type, bounds, default and meaning.

Each is declared once, here, as a field of the group its section names (``StoreSettings``,
``ModelSettings``, ...). ``Settings`` (``settings.py``) reads every group from the environment
once and hands each group to what needs it: a resource holds its group, never copies of its
fields. ``docs/configuration.md`` is generated from these declarations (``reference.py``).
Variables read outside Python (``bin/*``) or by Dagster itself are listed in ``ELSEWHERE``,
with the same fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from backfill_assets.config.sink_names import DEFAULT_BATCH as DEFAULT_SINK_BATCH
from backfill_assets.config.sink_names import DEFAULT_TABLE as DEFAULT_SINK_TABLE
from backfill_assets.config.sink_names import split_table_name
from backfill_assets.config.urls import checked_model_url, database_url
from backfill_assets.domain.checks.drift_baseline import LIVE_BASELINE, parse_baseline
from backfill_assets.domain.checks.rules import CheckBounds, DriftRule
from backfill_assets.domain.money.prices import PriceError, PriceTable
from backfill_assets.domain.ranges import MAX_OUTPUT_TOKENS, MAX_SETTING_SECONDS, MAX_TOKENS
from backfill_assets.domain.work.faults import KILL_POINTS, FaultHooks
from backfill_assets.domain.work.keys import DEFAULT_SLICE_TARGET
from backfill_assets.domain.work.outcomes import RetryPolicy

if TYPE_CHECKING:
    from backfill_assets.domain.policy.document import Policy

# Sections of docs/configuration.md, in order, with their titles: one group each.
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

# A source checkout (pyproject.toml beside the package) keeps its Dagster home inside the
# project, as bin/dev does; an installed package has no project to keep it in.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
CHECKOUT = (PROJECT_ROOT / "pyproject.toml").is_file() and (PROJECT_ROOT / "sql").is_dir()
# What the UI may import when BACKFILL_IMPORT_DIR is unset: the bundled demo export only.
DEMO_DIR = Path(__file__).resolve().parents[1] / "demo"
# The model a real provider is asked for when BACKFILL_MODEL is not set.
DEFAULT_OPENAI_MODEL = "gpt-4o-mini"
DEFAULT_FAKE_MODEL = "fake-moderator-1"
# The name of the environment's source in the store (its mark, its rejects): the CLI's
# ``import --sql ... --source posts_asset`` continues the same mark.
ENV_SOURCE_NAME = "posts_asset"
# How long an unanswered PostgreSQL peer may stay silent (BACKFILL_PG_DEAD_PEER_SECONDS).
DEFAULT_DEAD_PEER_SECONDS = 15.0


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


def _var(name: str, description: str, *, shown: str = "", **kw: Any) -> Any:
    """A field read from the variable ``name`` (the name errors report); ``shown`` is the
    default as the docs say it, when the value alone does not."""
    return Field(
        validation_alias=name, description=description, json_schema_extra={"shown": shown}, **kw
    )


@dataclass(frozen=True)
class Documented:
    """A variable read outside the groups: by ``bin/*``, the tests, or Dagster itself."""

    name: str
    section: str
    default: str
    meaning: str
    used_by: str = ""


class Group(BaseModel):
    """One section's variables, read from the environment by their names (a blank value is
    the default); code builds a group by field name (``StoreSettings(database_url=...)``)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    @classmethod
    def variables(cls) -> dict[str, str]:
        """Field name -> the variable it is read from."""
        return {name: str(f.validation_alias) for name, f in cls.model_fields.items()}

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Any:
        """The group as ``env`` sets it (``pydantic.ValidationError`` names a variable)."""
        found = {}
        for var in cls.variables().values():
            value = env.get(var)
            if isinstance(value, str) and value.strip():
                found[var] = value.strip()
        return cls.model_validate(found)


class StoreSettings(Group):
    """The store (our ledger) and the Dagster instance."""

    database_url: str = _var(
        "BACKFILL_DATABASE_URL",
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
        "Dagster instance (runs, events, `dagster.yaml`) and the default store's directory. "
        "The project's `dagster.yaml` (copied into a home without one) opts into the storage "
        "accelerators: Dagster's SQLite storage with an event log that holds its connections "
        "open (`instance_class: EmbeddedInstance`; Dagster's own storage, with one warning, on "
        "a Dagster other than 1.13.27). A home whose `dagster.yaml` names none of ours runs on "
        "Dagster's stock storage "
        "([architecture](architecture.md#one-run-many-partitions-no-work-no-run)).",
        shown="`.dagster_home/` in the project (`bin/prod`: `.dagster_prod/`); an installed "
        "package (a wheel, not a checkout): `$XDG_DATA_HOME/backfill-moderation`",
        default="",
    )
    xdg_data_home: str = _var(
        "XDG_DATA_HOME",
        "Only for an installed package without `DAGSTER_HOME`: its Dagster home goes in "
        "`backfill-moderation` under this directory.",
        shown="`~/.local/share`",
        default="",
    )
    pg_dead_peer_seconds: float = _var(
        "BACKFILL_PG_DEAD_PEER_SECONDS",
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
    webserver_url: str = _var(
        "DAGSTER_WEBSERVER_URL",
        "Where `backfill-moderation launch` finds the webserver (`--url` wins).",
        default="http://127.0.0.1:3000",
    )

    @property
    def dagster_home(self) -> Path:
        """``$DAGSTER_HOME``; else ``.dagster_home`` inside a source checkout, or the user's
        data directory (``$XDG_DATA_HOME/backfill-moderation``) for an installed package."""
        if self.dagster_home_dir:
            return Path(self.dagster_home_dir)
        if CHECKOUT:
            return PROJECT_ROOT / ".dagster_home"
        data = Path(self.xdg_data_home or Path.home() / ".local" / "share")
        return data / "backfill-moderation"

    @property
    def url(self) -> str:
        """``$BACKFILL_DATABASE_URL``, or a SQLite file in the Dagster home."""
        return self.database_url or f"sqlite:///{self.dagster_home / 'backfill.db'}"

    @field_validator("database_url")
    @classmethod
    def _database_url_parses(cls, value: str) -> str:
        if not value:
            return value
        url = database_url(value)
        if url.get_backend_name() not in ("sqlite", "postgresql"):
            raise ValueError(f"must be SQLite or PostgreSQL, not {url.get_backend_name()!r}")
        return value


class ModelSettings(Group):
    """The model, its policy, prices and service tier."""

    model_backend: Literal["fake", "openai"] = _var(
        "BACKFILL_MODEL_BACKEND",
        "`fake` (deterministic, in-process, no network) or `openai` (any OpenAI-compatible "
        "server, [providers.md](providers.md)).",
        default="fake",
    )
    model: str = _var(
        "BACKFILL_MODEL",
        "Model name; sent in every request, part of every key and of `moderation_labels`' code "
        "version. Pin a dated snapshot (`gpt-4o-mini-2024-07-18`): an alias that moves changes "
        "the labeller without changing the keys.",
        shown="`fake-moderator-1` (fake), `gpt-4o-mini` (openai)",
        default="",
    )
    model_base_url: str = _var(
        "BACKFILL_MODEL_BASE_URL",
        "Default endpoint (tenants without a region); requests go to `{base}/chat/completions` "
        "(`{base}/moderations` in the `openai-moderation` dialect), batch mode to "
        "`{base}/files` and `{base}/batches`.",
        default="https://api.openai.com/v1",
    )
    model_dialect: Literal["chat-json", "openai-moderation", "llama-guard", "safeguard"] = _var(
        "BACKFILL_MODEL_DIALECT",
        "How the model is spoken to: `chat-json` (chat completions answering the policy's JSON "
        "schema); `openai-moderation` (OpenAI's moderation endpoint, `omni-moderation-latest`: "
        "its category scores mapped onto the policy by the policy's `dialects:` section); "
        "`llama-guard` (Llama Guard 3/4 behind vLLM: its built-in categories through the "
        "model's chat template when the policy maps them, else the policy's rules as its "
        "categories through `{base}/completions`); `safeguard` (gpt-oss-safeguard behind vLLM: "
        "the policy as the system message, `reasoning_effort` from "
        "`BACKFILL_REASONING_EFFORT`). [policies.md](policies.md#dialects). Every dialect "
        "but `chat-json` needs `BACKFILL_MODEL_BACKEND=openai` and the standard tier; "
        "`llama-guard` and `safeguard` need sync dispatch (vLLM has no Batch API). Part of "
        "every key and of the code version.",
        default="chat-json",
    )
    llama_guard_version: Literal["3", "4"] = _var(
        "BACKFILL_LLAMA_GUARD_VERSION",
        "In the `llama-guard` dialect, the prompt format sent with the policy's own categories: "
        "Llama Guard 3's special tokens or Llama Guard 4's. Part of every key.",
        default="3",
    )
    reasoning_effort: Literal["low", "medium", "high"] = _var(
        "BACKFILL_REASONING_EFFORT",
        "In the `safeguard` dialect, the `reasoning_effort` of every request. Part of every key: "
        "a changed effort is new work.",
        default="medium",
    )
    safeguard_max_output_tokens: int = _var(
        "BACKFILL_SAFEGUARD_MAX_OUTPUT_TOKENS",
        "In the `safeguard` dialect, the output bound of a call (its reasoning and its answer). "
        "Generous on purpose (OpenAI's guide warns against capping it): the budget reserves "
        "it, so a long reasoning is paid for, never cut.",
        default=8192,
        ge=256,
        le=131_072,
    )
    moderation_inputs_per_request: int = _var(
        "BACKFILL_MODERATION_INPUTS_PER_REQUEST",
        "In the `openai-moderation` dialect, the most posts one request carries (its `input` "
        "array), all of one tenant: posts sent at the same moment are joined, each still its "
        "own key, attempt and result. 1: one post per request.",
        default=32,
        ge=1,
        le=256,
    )
    policy_path: str = _var(
        "BACKFILL_POLICY_PATH",
        "The moderation policy file: labels, rules, instructions ([policies.md](policies.md)). "
        "Its identity (id, version, content hash) is part of every key and of the code version. "
        "Read from the environment of the process that loads the definitions, never from run "
        "config.",
        shown="built-in policy (`backfill_assets/policies/default.yaml`)",
        default="",
    )
    cascade_path: str = _var(
        "BACKFILL_CASCADE_PATH",
        "A cascade file ([cascade.md](cascade.md)): stages of models, each deciding the posts "
        "it is sure of and passing the rest on, so the strong model is paid only for the hard "
        "posts. Each stage's endpoint and key come from `BACKFILL_MODEL_BASE_URL__<STAGE>` and "
        "`BACKFILL_MODEL_API_KEY__<STAGE>` (else the default endpoint's). Its stages name the "
        "work (the key version gains `+cascade@<hash>`), its decide rules the mapping version. "
        "Needs `BACKFILL_MODEL_BACKEND=openai` and sync dispatch.",
        shown="none (one model)",
        default="",
    )
    policy_min_macro_f1: float | None = _var(
        "BACKFILL_POLICY_MIN_MACRO_F1",
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
        "Replaced by `BACKFILL_POLICY_PATH`: setting it exits 2 with a message naming "
        "`BACKFILL_POLICY_PATH`.",
        default="",
    )
    logprobs: Flag = _var(
        "BACKFILL_LOGPROBS",
        "On: chat requests (`chat-json`, `safeguard`) ask for the answer's token "
        "log-probabilities (`logprobs: true`), from which each result's `p_label` (the chosen "
        "label's probability) is read. Off for a server that refuses the field (OpenAI's "
        "o-series reasoning models answer 400): `p_label` is then NULL. Never part of a key.",
        default=True,
    )
    max_tokens_param: Literal["max_tokens", "max_completion_tokens"] = _var(
        "BACKFILL_MAX_TOKENS_PARAM",
        "`max_completion_tokens` for models that refuse `max_tokens` (OpenAI's reasoning models).",
        default="max_tokens",
    )
    prices_json: str = _var(
        "BACKFILL_PRICES",
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
        "A file holding the same JSON as `BACKFILL_PRICES` (read once at start-up; a table of "
        "dated prices is easier to review in a file). Not both.",
        default="",
    )
    service_tier: Literal["standard", "flex"] = _var(
        "BACKFILL_SERVICE_TIER",
        "`flex`: send synchronous requests at OpenAI's flex tier (Batch API prices, slower, "
        "sometimes no capacity; timeouts raised to 900 s). `run --tier flex` sets it for one "
        "command.",
        default="standard",
    )
    flex_fallback: Literal["wait", "standard"] = _var(
        "BACKFILL_FLEX_FALLBACK",
        '`standard`: after `BACKFILL_FLEX_FALLBACK_AFTER_SECONDS` of flex answering "resource '
        'unavailable" in a row, send the rest of the run at the standard tier (logged; the '
        "partition's `service_tiers` metadata shows the split). `wait`: keep retrying flex.",
        default="wait",
    )
    flex_fallback_after_s: float = _var(
        "BACKFILL_FLEX_FALLBACK_AFTER_SECONDS",
        "How long flex may lack capacity before `BACKFILL_FLEX_FALLBACK=standard` gives up on it.",
        default=600.0,
        gt=0,
        le=MAX_SETTING_SECONDS,
    )
    # A model with no price books $0: refused unless the operator says so, or an invoice for a
    # whole tenant can silently read zero.
    allow_unpriced: Flag = _var(
        "BACKFILL_ALLOW_UNPRICED",
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

    @property
    def name(self) -> str:
        """The model asked for: ``BACKFILL_MODEL``, else the backend's default."""
        if self.model:
            return self.model
        return DEFAULT_FAKE_MODEL if self.model_backend == "fake" else DEFAULT_OPENAI_MODEL

    @property
    def dialect_variant(self) -> str:
        """What else the dialect sends that names the work (``Policy.variant``): Llama Guard's
        prompt format, safeguard's reasoning effort."""
        if self.model_dialect == "llama-guard":
            return self.llama_guard_version
        if self.model_dialect == "safeguard":
            return self.reasoning_effort
        return ""

    @property
    def max_output_tokens(self) -> int:
        """A call's output bound in this dialect (reserved by budgets)."""
        if self.model_dialect == "safeguard":
            return self.safeguard_max_output_tokens
        return MAX_OUTPUT_TOKENS

    def prices(self) -> PriceTable:
        """The price table: built-in list prices merged with ``BACKFILL_PRICES``."""
        return PriceTable.from_json(self.prices_json)

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

    @field_validator("prices_json")
    @classmethod
    def _prices_parse(cls, value: str) -> str:
        try:
            PriceTable.from_json(value)
        except PriceError as exc:
            raise ValueError(str(exc)) from None
        return value


class HttpSettings(Group):
    """An OpenAI-compatible endpoint's limits and timeouts."""

    rpm: int = _var(
        "BACKFILL_RPM",
        "The account's requests per minute for this endpoint and model (0: not set). Unset: the "
        "limiter adopts advertised limits, or starts at the first 429 from the rate it had "
        "reached.",
        default=0,
        ge=0,
        le=10**9,
    )
    tpm: int = _var(
        "BACKFILL_TPM",
        "The account's tokens per minute, as `BACKFILL_RPM`.",
        default=0,
        ge=0,
        le=10**12,
    )
    share_limit: Flag = _var(
        "BACKFILL_SHARE_LIMIT",
        "Share `BACKFILL_RPM`/`BACKFILL_TPM` with every process that uses the same endpoint, "
        "model and key, through the store (`limiter_members`, sql/006): each paces at its "
        "tenants' fair share. Off: each process paces to the full limit "
        "([operations.md](operations.md#one-provider-limit-across-processes)).",
        default=True,
    )
    adaptive: Flag = _var(
        "BACKFILL_ADAPTIVE",
        "AIMD on 429s and latency. Off: fixed pacing at the configured limits.",
        default=True,
    )
    trust_limit_headers: Flag = _var(
        "BACKFILL_TRUST_LIMIT_HEADERS",
        "Lower the limits to `x-ratelimit-limit-requests` / `-tokens` when the provider "
        "advertises less (never raise them).",
        default=True,
    )
    connect_timeout_s: float = _var(
        "BACKFILL_HTTP_CONNECT_TIMEOUT_S",
        "Connect timeout, seconds.",
        default=5.0,
        gt=0.0,
        le=MAX_SETTING_SECONDS,
    )
    read_timeout_s: float = _var(
        "BACKFILL_HTTP_READ_TIMEOUT_S",
        "Between-bytes timeout.",
        default=60.0,
        gt=0.0,
        le=MAX_SETTING_SECONDS,
    )
    total_timeout_s: float = _var(
        "BACKFILL_HTTP_TOTAL_TIMEOUT_S",
        "Whole-call timeout (waiting for a pooled connection included).",
        default=120.0,
        gt=0.0,
        le=MAX_SETTING_SECONDS,
    )
    retry_after_max_seconds: float = _var(
        "BACKFILL_RETRY_AFTER_MAX_SECONDS",
        default=900.0,
        gt=0.0,
        le=MAX_SETTING_SECONDS,
        description="Longest Retry-After honoured, for a key and for the endpoint's pause; a "
        "provider asking for more is waited this long, once logged, and counted "
        "(`retry_after_capped`).",
    )


class RunSettings(Group):
    """How a run behaves: concurrency, budget, retries, commits, slices."""

    concurrency: int = _var(
        "BACKFILL_CONCURRENCY",
        default=8,
        ge=1,
        le=1024,
        description="Model calls in flight per run (1..1024). With a real provider, at least "
        "RPM/60 x p99 latency (64 for 3,000 RPM at 200 ms): the limiter, not the concurrency, "
        "should hold the rate.",
    )
    tenant_budget_tokens: int = _var(
        "BACKFILL_TENANT_BUDGET_TOKENS",
        default=0,
        ge=0,
        le=MAX_TOKENS,
        description="Strict per-tenant token cap (0: none): billed + reserved never exceeds "
        "it; keys that do not fit are `deferred`. A tenant's own cap (`tenant set-budget TENANT "
        "--tokens N`) replaces it; dollar caps are per tenant only (`--usd`), kept in the "
        "store, never in the environment or run config.",
    )
    max_attempts: int = _var(
        "BACKFILL_MAX_ATTEMPTS",
        default=5,
        ge=1,
        le=20,
        description="Attempts per key before `retry_exhausted` (1..20).",
    )
    retry_base_seconds: float = _var(
        "BACKFILL_RETRY_BASE_SECONDS",
        default=0.5,
        ge=0.0,
        le=MAX_SETTING_SECONDS,
        description="Exponential back-off base, full jitter.",
    )
    retry_max_seconds: float = _var(
        "BACKFILL_RETRY_MAX_SECONDS",
        default=30.0,
        ge=0.0,
        le=MAX_SETTING_SECONDS,
        description="Back-off ceiling (a provider's Retry-After wins over the back-off).",
    )
    flush_ms: float = _var(
        "BACKFILL_FLUSH_MS",
        default=100.0,
        gt=0.0,
        le=1000.0,
        description="Longest a finished call waits before its usage and outcome are committed "
        "(the group commit).",
    )
    slice_target_posts: int = _var(
        "BACKFILL_SLICE_TARGET_POSTS",
        default=DEFAULT_SLICE_TARGET,
        ge=0,
        le=10**9,
        description="Slices fill by volume: a tenant uses 1, 2, 4, 8 or 16 of its partitions, "
        "the fewest that keep each at or below this many posts; `import` raises a tenant's "
        "level as it grows (never lowers it). 0: always 16. Changing it changes which partition "
        "a post maps to (from the next import on), but results are keyed by content, not by "
        "partition, so nothing is re-sent or re-paid.",
    )

    def retry(self, http: HttpSettings) -> RetryPolicy:
        """The run's retry policy; ``http`` gives the longest Retry-After honoured."""
        return RetryPolicy(
            max_attempts=self.max_attempts,
            retry_base_seconds=self.retry_base_seconds,
            retry_max_seconds=self.retry_max_seconds,
            retry_after_max_seconds=http.retry_after_max_seconds,
        )

    @property
    def budget_tokens(self) -> int | None:
        """The strict per-tenant token cap, None when there is none."""
        return self.tenant_budget_tokens or None

    @property
    def flush_interval_s(self) -> float:
        """The group commit's longest wait, in seconds."""
        return self.flush_ms / 1000.0


class OrchestrationSettings(Group):
    """How runs are pooled and spread over processes."""

    partitions_per_run: int = _var(
        "BACKFILL_PARTITIONS_PER_RUN",
        "Partitions per run in a UI or `launch` backfill (`BackfillPolicy.multi_run`).",
        default=16,
        ge=1,
        le=100_000,
    )
    run_processes: int = _var(
        "BACKFILL_RUN_PROCESSES",
        "Processes a CLI `run` may spread a big plan over (0: the cores, at most 4; 1: one "
        "process). Each sends at most `BACKFILL_CONCURRENCY / processes` calls at once; small "
        'runs stay in one process (docs/architecture.md, "A big `run` uses every core").',
        default=0,
        ge=0,
        le=64,
    )
    executor: Literal["in_process", "multiprocess", "celery"] = _var(
        "BACKFILL_EXECUTOR",
        "`multiprocess` restores Dagster's default executor (a process per step; only the "
        "orchestration benchmark wants it). `celery`: each step is a task on the Celery workers "
        "that `bin/prod worker` starts, on any host reaching the broker, the store and the "
        "instance ([operations.md](operations.md#celery-steps-on-several-hosts)).",
        default="in_process",
    )
    celery_broker_url: str = _var(
        "BACKFILL_CELERY_BROKER_URL",
        "With `BACKFILL_EXECUTOR=celery`: the broker the runs send steps to and `bin/prod "
        "worker` takes them from (the same URL on every host); a secret, its password never "
        "printed.",
        default="pyamqp://guest@127.0.0.1:5672//",
        repr=False,
    )


class BatchSettings(Group):
    """Batch mode and deadline plans."""

    dispatch: Literal["sync", "batch"] = _var(
        "BACKFILL_DISPATCH",
        default="sync",
        pattern="^(sync|batch)$",
        description="`sync` (one call per key) or `batch` (the provider's Batch API, about "
        "half price, 24 h window; needs `BACKFILL_MODEL_BACKEND=openai`).",
    )
    batch_max_lines: int = _var(
        "BACKFILL_BATCH_MAX_LINES",
        default=50_000,
        ge=1,
        le=50_000,
        description="Requests per batch file (1..50,000; files are also split at the "
        "provider's 200 MB).",
    )
    batch_poll_seconds: float = _var(
        "BACKFILL_BATCH_POLL_SECONDS",
        default=30.0,
        gt=0.0,
        le=MAX_SETTING_SECONDS,
        description="First status poll after a create; each poll waits 1.5x longer, up to 10 "
        "minutes.",
    )
    batch_max_output_bytes: int = _var(
        "BACKFILL_BATCH_MAX_OUTPUT_BYTES",
        default=512 * 1024 * 1024,
        ge=1024,
        le=1 << 40,
        description="The largest batch output or error file read back (streamed to an unnamed "
        "temporary file, never held whole). Past it the chunk fails, reported, and its keys "
        "stay pending.",
    )
    # The pessimistic reading of the provider's promise: the whole completion window.
    batch_prior_seconds: float = _var(
        "BACKFILL_BATCH_PRIOR_SECONDS",
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
        "What `run --deadline` assumes of flex (with `BACKFILL_SERVICE_TIER=flex` or `--tier "
        "flex`) until this store has sent 100 flex requests under deadline plans: the share "
        "refused for capacity (a refused key is sent again, so flex finishes that share fewer "
        "keys per second).",
        default=0.25,
        ge=0.0,
        le=1.0,
    )
    batch_create_lookup_seconds: float = _var(
        "BACKFILL_BATCH_CREATE_LOOKUP_SECONDS",
        default=600.0,
        ge=0.0,
        le=MAX_SETTING_SECONDS,
        description="After a create that got no answer: how long to look for its batch in the "
        "provider's list (which may lag) before creating it again.",
    )


class ChecksSettings(Group):
    """What the operator trusts: the checks' bounds, drift, the apply target."""

    max_rebilled_share: float = _var(
        "BACKFILL_CHECK_MAX_REBILLED_SHARE",
        default=0.05,
        ge=0.0,
        le=1.0,
        description="`spend`: rebilled tokens allowed, as a share of the partition's billed "
        "tokens.",
    )
    max_orphan_attempts: int = _var(
        "BACKFILL_CHECK_MAX_ORPHAN_ATTEMPTS",
        default=16,
        ge=0,
        le=10**9,
        description="`spend`: attempts with no usage/error booked (the crash window).",
    )
    max_tokens_per_key: int = _var(
        "BACKFILL_CHECK_MAX_TOKENS_PER_KEY",
        default=0,
        ge=0,
        le=MAX_TOKENS,
        description="`spend`: billed tokens per expected key (0: no bound).",
    )
    max_over_bound_calls: int = _var(
        "BACKFILL_CHECK_MAX_OVER_BOUND_CALLS",
        default=0,
        ge=0,
        le=10**9,
        description="`billed_within_bound` (blocking): calls billed past the bound reserved "
        "for them a partition may hold and still have its labels applied. Raise it only after "
        "looking at the provider's bill.",
    )
    drift_baseline: str = _var(
        "BACKFILL_DRIFT_BASELINE",
        default=LIVE_BASELINE,
        description="`label_drift` baseline: `live` (label shares in the posts' live "
        "`moderation_label` column, excluding labels this rubric wrote) or a JSON object of "
        'shares over the policy\'s labels, e.g. `{"ok": 0.8, "spam": 0.1, "abuse": 0.05}`.',
    )
    drift_labels: str = _var(
        "BACKFILL_DRIFT_LABELS",
        default="",
        description="Labels watched for drift, comma-separated; each must be a label of the "
        "policy. Empty: the policy's labels whose action is not `none`.",
        shown="the policy's labels whose action is not `none`",
    )
    drift_factor: float = _var(
        "BACKFILL_DRIFT_FACTOR",
        default=5.0,
        gt=1.0,
        le=1000.0,
        description="A watched label warns when its share reaches this x the baseline.",
    )
    drift_min_count: int = _var(
        "BACKFILL_DRIFT_MIN_COUNT",
        default=5,
        ge=1,
        le=10**9,
        description="... and it was seen at least this many times.",
    )
    max_stage_share_drift: float = _var(
        "BACKFILL_CHECK_MAX_STAGE_SHARE_DRIFT",
        default=0.15,
        ge=0.0,
        le=1.0,
        description="`stage_drift` (a cascade; warns, never blocks): how far the share of a "
        "partition's labels its first stage decided may stray from the share the gold set's "
        "threshold sweep found for the same decide rules (0.15: 70% on the gold set, 55% to "
        "85% here), once the partition has `BACKFILL_DRIFT_MIN_COUNT` labels.",
    )
    min_kappa: float = _var(
        "BACKFILL_CHECK_MIN_KAPPA",
        default=0.6,
        ge=-1.0,
        le=1.0,
        description="`agreement` (warns, never blocks): the lowest Cohen's kappa between the "
        "model's labels and moderators' decisions over a tenant's decided posts under the "
        "policy version in force, once it has `BACKFILL_DRIFT_MIN_COUNT` of them (0.6: the "
        "lower end of what Landis and Koch call substantial agreement, 0.61 to 0.80).",
    )
    apply_live: Flag = _var(
        "BACKFILL_APPLY_LIVE",
        default=False,
        description="Off: `applied_labels` writes the shadow columns only; on also writes the "
        "live `moderation_label` columns.",
    )

    def bounds(self, policy: Policy) -> CheckBounds:
        """The pure checks' bounds; drift watches ``policy``'s flagging labels by default."""
        watched = tuple(x.strip() for x in self.drift_labels.split(",") if x.strip())
        return CheckBounds(
            max_rebilled_share=self.max_rebilled_share,
            max_orphan_attempts=self.max_orphan_attempts,
            max_tokens_per_key=self.max_tokens_per_key,
            max_over_bound_calls=self.max_over_bound_calls,
            max_stage_share_drift=self.max_stage_share_drift,
            drift=DriftRule(
                labels=watched or policy.flagging_labels,
                factor=self.drift_factor,
                min_count=self.drift_min_count,
            ),
            min_kappa=self.min_kappa,
        )

    def configured_baseline(self, policy: Policy) -> dict[str, float] | None:
        """A configured distribution, or None when the live moderation is the baseline."""
        if self.drift_baseline.strip() == LIVE_BASELINE:
            return None
        return parse_baseline(self.drift_baseline, policy.label_ids)


class DataSettings(Group):
    """Data in and out: the import directory, the database source, the sink."""

    import_dir: str = _var(
        "BACKFILL_IMPORT_DIR",
        default="",
        description="The only directory the `posts` asset reads when it is materialised from "
        "Dagster (the UI, GraphQL): its `path` config is relative to it, and a path (or a "
        "symbolic link) leading outside it fails the run. Absolute path; empty: the bundled "
        "demo export's directory. The CLI's `import PATH` is not limited by it.",
        shown="the bundled demo export's directory",
    )
    sink_url: str = _var(
        "BACKFILL_SINK_URL",
        "A database `applied_labels` also writes labels back into "
        "([data.md](data.md#labels-back-into-the-platforms-table)); a secret, never printed "
        "unmasked, never set by run config.",
        default="",
        repr=False,
    )
    sink_table: str = _var(
        "BACKFILL_SINK_TABLE",
        "The sink's table (`table` or `schema.table`); `sink ddl` prints its DDL, `sink check` "
        "verifies it.",
        default=DEFAULT_SINK_TABLE,
    )
    sink_batch: int = _var(
        "BACKFILL_SINK_BATCH",
        "Rows per write-back transaction.",
        default=DEFAULT_SINK_BATCH,
        ge=1,
        le=100_000,
    )
    source_url: str = _var(
        "BACKFILL_SOURCE_URL",
        "A database the `posts` asset imports from instead of a file (any SQLAlchemy URL; "
        "`postgresql://` is pinned to psycopg2 and read through a server-side cursor; a SQLite "
        "file is opened read-only).",
        default="",
        repr=False,
    )
    source_query: str = _var(
        "BACKFILL_SOURCE_QUERY",
        "The `SELECT` that returns `tenant_id`, `post_id` and `text` (optionally `region` and "
        "the cursor column): one statement, run in a read-only transaction (what is enforced: "
        "[data.md](data.md#what-a-source-query-can-do)).",
        shown="none (required with the URL)",
        default="",
    )
    source_cursor: str = _var(
        "BACKFILL_SOURCE_CURSOR",
        "A column of the query: each import reads only the rows from the last one's high-water "
        "mark's cursor value on (that value again), kept in the store as source `posts_asset`.",
        default="",
    )
    source_schedule: str = _var(
        "BACKFILL_SOURCE_SCHEDULE",
        "Cron of the `incremental_import` schedule (shipped stopped; ticks are skipped while no "
        "source is set).",
        default="*/15 * * * *",
    )

    def import_root(self) -> Path:
        """Where the ``posts`` asset may read exports (``BACKFILL_IMPORT_DIR``)."""
        return Path(self.import_dir) if self.import_dir else DEMO_DIR

    @model_validator(mode="after")
    def _source_is_whole(self) -> DataSettings:
        if self.source_url and not self.source_query:
            raise ValueError("BACKFILL_SOURCE_URL is set but BACKFILL_SOURCE_QUERY is not")
        if not self.source_url and (self.source_query or self.source_cursor):
            raise ValueError("BACKFILL_SOURCE_QUERY/_CURSOR are set but BACKFILL_SOURCE_URL is not")
        return self

    @field_validator("sink_url", "source_url")
    @classmethod
    def _platform_url_parses(cls, value: str) -> str:
        # Refused at start, as the store's is, rather than in the step that first uses it.
        if value:
            database_url(value)
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


class DrillSettings(Group):
    """Test-only: crash drills and the fake model's hostile modes."""

    kill_after_usage: int = _var(
        "BACKFILL_KILL_AFTER_USAGE",
        "SIGKILL the process right after the commit that makes the Nth usage event durable "
        "(sync crash drills; 0: off).",
        default=0,
        ge=0,
        le=10**9,
    )
    kill_at: str = _var(
        "BACKFILL_KILL_AT",
        "SIGKILL a batch-mode run the first time it reaches `intent`, `upload`, `create`, "
        "`poll` or `fetch`, or (`run --deadline`) `cancel`: right after the switch-over's "
        "cancels are sent; or (`helper`) every helper process of a `run` over several "
        "processes, as soon as it is forked.",
        shown="off",
        default="",
    )
    fake_latency_ms: float = _var(
        "BACKFILL_FAKE_LATENCY_MS",
        "Fake model: added latency per call.",
        default=0.0,
        ge=0.0,
        le=600_000.0,
    )
    fake_failure_rate: float = _var(
        "BACKFILL_FAKE_FAILURE_RATE",
        "Fake model: share of calls failing retriably, decided by hash(key, attempt).",
        default=0.0,
        ge=0.0,
        le=1.0,
    )
    fake_malformed_rate: float = _var(
        "BACKFILL_FAKE_MALFORMED_RATE",
        "Fake model: share of keys answered malformed, decided by hash(key).",
        default=0.0,
        ge=0.0,
        le=1.0,
    )
    fake_overbill_factor: float = _var(
        "BACKFILL_FAKE_OVERBILL_FACTOR",
        "Fake model: bill the prompt tokens times this (another tokenizer than ours; > 1 can "
        "exceed the reserved bound, which stops the tenant).",
        default=1.0,
        gt=0.0,
        le=1000.0,
    )
    fake_usage_shape: Literal["split", "total", "missing"] = _var(
        "BACKFILL_FAKE_USAGE_SHAPE",
        "Fake model: report usage as `split` (prompt and completion), `total` (total only) or "
        "`missing` (none; the bound is booked).",
        default="split",
    )

    def faults(self) -> FaultHooks:
        """``BACKFILL_KILL_AFTER_USAGE`` and ``BACKFILL_KILL_AT`` (crash drills only)."""
        return FaultHooks(kill_after_usage=self.kill_after_usage, kill_at=self.kill_at)

    @field_validator("kill_at")
    @classmethod
    def _kill_point_known(cls, value: str) -> str:
        # The points are the drill hooks' own list (faults.KILL_POINTS), not a copy of it.
        if value and value not in KILL_POINTS:
            raise ValueError(f"expected one of {', '.join(KILL_POINTS)}")
        return value


def default_retry() -> RetryPolicy:
    """The retry policy of the settings' defaults (a run built without settings: tests)."""
    return RunSettings().retry(HttpSettings())


# Every group, by section: what ``Settings`` holds and the reference page lists.
GROUPS: dict[str, type[Group]] = {
    "store": StoreSettings,
    "model": ModelSettings,
    "http": HttpSettings,
    "run": RunSettings,
    "orchestration": OrchestrationSettings,
    "batch": BatchSettings,
    "checks": ChecksSettings,
    "data": DataSettings,
    "drills": DrillSettings,
}


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
