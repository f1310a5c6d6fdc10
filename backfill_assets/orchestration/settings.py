"""The environment, read once: ``Settings.from_env`` parses and checks every variable.

The CLI's entry point and ``definitions.py`` are the only callers; everything below them is
handed the ``Settings`` object (or what it builds: resources, fault hooks, versions). A bad
value is a ``SettingsError`` that names the variable (the CLI exits 2 on it).

Variables whose names carry a region (``BACKFILL_MODEL_BASE_URL__<REGION>``) are read
explicitly, and no API key is ever read here: the adapters resolve keys by name at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import dagster as dg
import sqlalchemy as sa
from pydantic import (
    BeforeValidator,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from sqlalchemy.engine import Engine

from backfill_assets.core.faults import KILL_POINTS, FaultHooks
from backfill_assets.core.keys import Versions
from backfill_assets.core.policy import PolicyInvalid, builtin_policy, load_policy
from backfill_assets.core.prices import PriceError, PriceTable
from backfill_assets.core.regions import API_KEY_VAR, BASE_URL_VAR, InvalidRegion, region_of_suffix
from backfill_assets.core.rubric import Rubric
from backfill_assets.core.urls import redact_url
from backfill_assets.ingest.sql_import import SqlSource
from backfill_assets.orchestration.checks_config import (
    LIVE_BASELINE,
    ChecksConfigError,
    ChecksResource,
    parse_baseline,
    unknown_labels,
)
from backfill_assets.orchestration.engines import engine_for
from backfill_assets.orchestration.model_resources import (
    FakeModelResource,
    ModelResource,
    OpenAIModelResource,
    versions_for,
)
from backfill_assets.orchestration.posts_asset import ENV_SOURCE_NAME
from backfill_assets.orchestration.resources import RunSettings, StoreResource
from backfill_assets.store.dead_peer import DEFAULT_DEAD_PEER_SECONDS
from backfill_assets.store.sink import DEFAULT_BATCH as DEFAULT_SINK_BATCH
from backfill_assets.store.sink import DEFAULT_TABLE as DEFAULT_SINK_TABLE
from backfill_assets.store.sink import Sink, split_table_name

# A source checkout (pyproject.toml beside the package) keeps its Dagster home inside the
# project, as bin/dev does; an installed package has no project to keep it in.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
CHECKOUT = (PROJECT_ROOT / "pyproject.toml").is_file() and (PROJECT_ROOT / "sql").is_dir()


# The model a real provider is asked for when BACKFILL_MODEL is not set.
DEFAULT_OPENAI_MODEL = "gpt-4o-mini"


class SettingsError(ValueError):
    """An environment variable with a value we cannot use."""


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


def _var(name: str, **kw: Any) -> Any:
    """A field read from the variable ``name`` (the name errors report)."""
    return Field(validation_alias=name, **kw)


def _run_var(name: str, field: str) -> Any:
    """A field of the ``settings`` resource (``RunSettings``), read from the variable ``name``:
    its default, bounds and description are declared once, on the resource."""
    return FieldInfo.merge_field_infos(RunSettings.model_fields[field], validation_alias=name)


_MAX_PRICES_BYTES = 1 << 20


def _read_prices_file(values: dict[str, Any]) -> None:
    """``BACKFILL_PRICES_PATH``: the price table's JSON from a file, as if in BACKFILL_PRICES."""
    path = values.get("BACKFILL_PRICES_PATH")
    if not path:
        return
    if values.get("BACKFILL_PRICES"):
        raise SettingsError("set BACKFILL_PRICES or BACKFILL_PRICES_PATH, not both")
    try:
        if Path(path).stat().st_size > _MAX_PRICES_BYTES:
            raise SettingsError(f"BACKFILL_PRICES_PATH: {path} is over 1 MiB: not a price table")
        text = Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(
            f"BACKFILL_PRICES_PATH: cannot read {path} ({type(exc).__name__})"
        ) from None
    try:
        PriceTable.from_json(text)
    except PriceError as exc:
        raise SettingsError(f"BACKFILL_PRICES_PATH: {path}: {exc}") from None
    values["BACKFILL_PRICES"] = text


class Settings(BaseSettings):
    """Every variable the product reads, typed and checked; blank means the default."""

    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", frozen=True)

    # Where things are.
    dagster_home_dir: str = _var("DAGSTER_HOME", default="")
    # Only for an installed package without DAGSTER_HOME: where its Dagster home goes.
    xdg_data_home: str = _var("XDG_DATA_HOME", default="")
    database_url: str = _var("BACKFILL_DATABASE_URL", default="")
    webserver_url: str = _var("DAGSTER_WEBSERVER_URL", default="http://127.0.0.1:3000")
    # PostgreSQL: how soon a silent peer is given up, on both ends (store/dead_peer.py).
    pg_dead_peer_seconds: float = _var(
        "BACKFILL_PG_DEAD_PEER_SECONDS", default=DEFAULT_DEAD_PEER_SECONDS, ge=2.0, le=86400.0
    )
    # Run behaviour: the ``settings`` resource's fields, declared there (``_run_var``).
    concurrency: int = _run_var("BACKFILL_CONCURRENCY", "concurrency")
    tenant_budget_tokens: int = _run_var("BACKFILL_TENANT_BUDGET_TOKENS", "tenant_budget_tokens")
    max_attempts: int = _run_var("BACKFILL_MAX_ATTEMPTS", "max_attempts")
    retry_base_seconds: float = _run_var("BACKFILL_RETRY_BASE_SECONDS", "retry_base_seconds")
    retry_max_seconds: float = _run_var("BACKFILL_RETRY_MAX_SECONDS", "retry_max_seconds")
    retry_after_max_seconds: float = _run_var(
        "BACKFILL_RETRY_AFTER_MAX_SECONDS", "retry_after_max_seconds"
    )
    flush_ms: float = _run_var("BACKFILL_FLUSH_MS", "flush_ms")
    # The moderation policy file (docs/policies.md); blank: the built-in policy. Read here, by
    # the process that runs the work, never from run config.
    policy_path: str = _var("BACKFILL_POLICY_PATH", default="")
    # The gate: run and launch refuse a policy whose latest evaluation's macro-F1 is lower.
    policy_min_macro_f1: float | None = _var(
        "BACKFILL_POLICY_MIN_MACRO_F1", default=None, ge=0.0, le=1.0
    )
    # Replaced by BACKFILL_POLICY_PATH: setting it is an error, never silently ignored.
    prompt_path: str = _var("BACKFILL_PROMPT_PATH", default="")
    import_dir: str = _run_var("BACKFILL_IMPORT_DIR", "import_dir")
    slice_target_posts: int = _run_var("BACKFILL_SLICE_TARGET_POSTS", "slice_target_posts")
    dispatch: Literal["sync", "batch"] = _run_var("BACKFILL_DISPATCH", "dispatch")
    batch_max_lines: int = _run_var("BACKFILL_BATCH_MAX_LINES", "batch_max_lines")
    batch_max_output_bytes: int = _run_var(
        "BACKFILL_BATCH_MAX_OUTPUT_BYTES", "batch_max_output_bytes"
    )
    batch_poll_seconds: float = _run_var("BACKFILL_BATCH_POLL_SECONDS", "batch_poll_seconds")
    # What a deadline plan assumes a batch takes before this store has a history: the whole
    # 24 h completion window, the pessimistic reading of the provider's promise.
    batch_prior_seconds: float = _var("BACKFILL_BATCH_PRIOR_SECONDS", default=86_400.0, gt=0.0)
    # What a deadline plan assumes of flex before this store has a history: the share of flex
    # requests refused for capacity.
    flex_unavailable_prior: float = _var(
        "BACKFILL_FLEX_UNAVAILABLE_PRIOR", default=0.25, ge=0.0, le=1.0
    )
    batch_create_lookup_seconds: float = _run_var(
        "BACKFILL_BATCH_CREATE_LOOKUP_SECONDS", "batch_create_lookup_seconds"
    )
    # Orchestration.
    partitions_per_run: int = _var("BACKFILL_PARTITIONS_PER_RUN", default=16, ge=1)
    # Processes a CLI ``run`` spreads a big plan over (0: the cores, at most 4).
    run_processes: int = _var("BACKFILL_RUN_PROCESSES", default=0, ge=0, le=64)
    executor: Literal["in_process", "multiprocess"] = _var(
        "BACKFILL_EXECUTOR", default="in_process"
    )
    # Crash drills only: never resource config (see faults.py).
    kill_at: str = _var("BACKFILL_KILL_AT", default="")
    kill_after_usage: int = _var("BACKFILL_KILL_AFTER_USAGE", default=0, ge=0)
    # The model.
    model_backend: Literal["fake", "openai"] = _var("BACKFILL_MODEL_BACKEND", default="fake")
    model: str = _var("BACKFILL_MODEL", default="")
    fake_latency_ms: float = _var("BACKFILL_FAKE_LATENCY_MS", default=0.0)
    fake_failure_rate: float = _var("BACKFILL_FAKE_FAILURE_RATE", default=0.0)
    fake_malformed_rate: float = _var("BACKFILL_FAKE_MALFORMED_RATE", default=0.0)
    fake_overbill_factor: float = _var("BACKFILL_FAKE_OVERBILL_FACTOR", default=1.0, gt=0.0)
    fake_usage_shape: Literal["split", "total", "missing"] = _var(
        "BACKFILL_FAKE_USAGE_SHAPE", default="split"
    )
    model_base_url: str = _var("BACKFILL_MODEL_BASE_URL", default="https://api.openai.com/v1")
    rpm: int = _var("BACKFILL_RPM", default=0, ge=0)
    tpm: int = _var("BACKFILL_TPM", default=0, ge=0)
    adaptive: Flag = _var("BACKFILL_ADAPTIVE", default=True)
    share_limit: Flag = _var("BACKFILL_SHARE_LIMIT", default=True)
    trust_limit_headers: Flag = _var("BACKFILL_TRUST_LIMIT_HEADERS", default=True)
    http_connect_timeout_s: float = _var("BACKFILL_HTTP_CONNECT_TIMEOUT_S", default=5.0, gt=0.0)
    http_read_timeout_s: float = _var("BACKFILL_HTTP_READ_TIMEOUT_S", default=60.0, gt=0.0)
    http_total_timeout_s: float = _var("BACKFILL_HTTP_TOTAL_TIMEOUT_S", default=120.0, gt=0.0)
    max_tokens_param: Literal["max_tokens", "max_completion_tokens"] = _var(
        "BACKFILL_MAX_TOKENS_PARAM", default="max_tokens"
    )
    # flex: OpenAI's slower tier at the Batch API's price; refused for capacity at times.
    service_tier: Literal["standard", "flex"] = _var("BACKFILL_SERVICE_TIER", default="standard")
    # After this long without flex capacity: keep waiting, or send the rest at standard.
    flex_fallback: Literal["wait", "standard"] = _var("BACKFILL_FLEX_FALLBACK", default="wait")
    flex_fallback_after_s: float = _var("BACKFILL_FLEX_FALLBACK_AFTER_SECONDS", default=600.0, gt=0)
    prices_json: str = _var("BACKFILL_PRICES", default="")
    # The same JSON in a file (read once, at start-up); not both.
    prices_path: str = _var("BACKFILL_PRICES_PATH", default="")
    # A model with no price books $0: refused unless the operator says so, or an invoice for a
    # whole tenant can silently read zero.
    allow_unpriced: Flag = _var("BACKFILL_ALLOW_UNPRICED", default=False)
    # Set by from_env from variables with dynamic names; the API key itself is never read.
    region_base_urls: dict[str, str] = Field(default_factory=dict)
    api_key_set: bool = False
    # Policy: bounds of the checks and the apply target (unset: PolicyResource's default).
    check_max_rebilled_share: float | None = _var(
        "BACKFILL_CHECK_MAX_REBILLED_SHARE", default=None, ge=0.0
    )
    check_max_orphan_attempts: int | None = _var(
        "BACKFILL_CHECK_MAX_ORPHAN_ATTEMPTS", default=None, ge=0
    )
    check_max_tokens_per_key: int | None = _var(
        "BACKFILL_CHECK_MAX_TOKENS_PER_KEY", default=None, ge=0
    )
    check_max_over_bound_calls: int | None = _var(
        "BACKFILL_CHECK_MAX_OVER_BOUND_CALLS", default=None, ge=0
    )
    drift_baseline: str | None = _var("BACKFILL_DRIFT_BASELINE", default=None)
    drift_labels: str | None = _var("BACKFILL_DRIFT_LABELS", default=None)
    drift_factor: float | None = _var("BACKFILL_DRIFT_FACTOR", default=None, gt=1.0)
    drift_min_count: int | None = _var("BACKFILL_DRIFT_MIN_COUNT", default=None, ge=1)
    apply_live: Flag | None = _var("BACKFILL_APPLY_LIVE", default=None)
    # The posts asset's database source (docs/data.md); the URL is a secret: never in a repr.
    source_url: str = _var("BACKFILL_SOURCE_URL", default="", repr=False)
    source_query: str = _var("BACKFILL_SOURCE_QUERY", default="")
    source_cursor: str = _var("BACKFILL_SOURCE_CURSOR", default="")
    source_schedule: str = _var("BACKFILL_SOURCE_SCHEDULE", default="*/15 * * * *")
    # Where applied_labels also writes labels back (docs/data.md); the URL is a secret too.
    sink_url: str = _var("BACKFILL_SINK_URL", default="", repr=False)
    sink_table: str = _var("BACKFILL_SINK_TABLE", default=DEFAULT_SINK_TABLE)
    sink_batch: int = _var("BACKFILL_SINK_BATCH", default=DEFAULT_SINK_BATCH, ge=1, le=100_000)
    _rubric: Rubric | None = PrivateAttr(default=None)

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
        try:
            url = sa.engine.make_url(value)
        except (sa.exc.ArgumentError, ValueError):
            raise ValueError("is not a database URL (sqlite:///path or postgresql://...)") from None
        if url.get_backend_name() not in ("sqlite", "postgresql"):
            raise ValueError(f"must be SQLite or PostgreSQL, not {url.get_backend_name()!r}")
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

    @model_validator(mode="after")
    def _source_is_whole(self) -> Settings:
        if self.source_url and not self.source_query:
            raise ValueError("BACKFILL_SOURCE_URL is set but BACKFILL_SOURCE_QUERY is not")
        if not self.source_url and (self.source_query or self.source_cursor):
            raise ValueError("BACKFILL_SOURCE_QUERY/_CURSOR are set but BACKFILL_SOURCE_URL is not")
        return self

    @model_validator(mode="after")
    def _model_is_priced(self) -> Settings:
        # The fake model bills no one; a real provider's model must have a price to book.
        if self.model_backend != "openai" or self.allow_unpriced:
            return self
        model = self.model or DEFAULT_OPENAI_MODEL
        if PriceTable.from_json(self.prices_json).price_for(model) is None:
            raise ValueError(
                f"BACKFILL_MODEL {model!r} has no price: add it to BACKFILL_PRICES (or the file "
                "BACKFILL_PRICES_PATH names) "
                '({"model": {"input": usd_per_1M, "output": usd_per_1M}}), or set '
                "BACKFILL_ALLOW_UNPRICED=1 to book its calls at $0"
            )
        return self

    @model_validator(mode="after")
    def _batch_needs_a_batch_api(self) -> Settings:
        if self.dispatch == "batch" and self.model_backend != "openai":
            raise ValueError("BACKFILL_DISPATCH=batch needs BACKFILL_MODEL_BACKEND=openai")
        return self

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

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, load_policy: bool = True) -> Settings:
        """Parse ``env`` (e.g. ``os.environ``) once; ``SettingsError`` names a bad variable.

        The policy file is read and checked here too, unless ``load_policy`` is false (then
        on first use).
        """
        # Values are stripped, and a blank one means the default, as always.
        found = _MappingSource(cls, env)().items()
        values: dict[str, Any] = {
            k: v.strip() for k, v in found if isinstance(v, str) and v.strip()
        }
        values["region_base_urls"] = region_base_urls(env)
        values["api_key_set"] = bool(env.get(API_KEY_VAR))
        _read_prices_file(values)
        try:
            settings = cls.model_validate(values)
        except ValidationError as exc:
            raise SettingsError("; ".join(_describe(e) for e in exc.errors()[:3])) from None
        if load_policy:
            settings._check_policy()
        return settings

    def rubric(self) -> Rubric:
        """The moderation policy in force (``BACKFILL_POLICY_PATH``, else the built-in one),
        compiled; read once, so the keys and the requests of a process use the same text."""
        if self._rubric is None:
            if not self.policy_path:
                self._rubric = Rubric(builtin_policy())
            else:
                try:
                    self._rubric = Rubric(load_policy(self.policy_path))
                except PolicyInvalid as exc:
                    raise SettingsError(f"BACKFILL_POLICY_PATH: {exc}") from None
        return self._rubric

    def _check_policy(self) -> None:
        """The policy loads, and the drift settings name its labels (at load, not in a check)."""
        policy = self.rubric().policy
        if self.drift_labels and (bad := unknown_labels(self.drift_labels, policy.label_ids)):
            raise SettingsError(
                f"BACKFILL_DRIFT_LABELS={self.drift_labels[:60]!r}: not labels of policy "
                f"{policy.identity}: {', '.join(bad[:5])}"
            )
        if self.drift_baseline is not None and self.drift_baseline != LIVE_BASELINE:
            try:
                parse_baseline(self.drift_baseline, policy.label_ids)
            except ChecksConfigError as exc:
                raise SettingsError(
                    f"BACKFILL_DRIFT_BASELINE={self.drift_baseline[:60]!r}: {exc}"
                ) from None

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
    def store_url(self) -> str:
        """``$BACKFILL_DATABASE_URL``, or a SQLite file in the Dagster home."""
        return self.database_url or f"sqlite:///{self.dagster_home / 'backfill.db'}"

    def store_engine(self) -> Engine:
        """The migrated engine of the store, with these settings' dead-peer time."""
        return engine_for(self.store_url, self.pg_dead_peer_seconds)

    def run_settings(self) -> RunSettings:
        """The ``settings`` resource: how a run behaves."""
        return RunSettings(**{name: getattr(self, name) for name in RunSettings.model_fields})

    def faults(self) -> FaultHooks:
        """``BACKFILL_KILL_AFTER_USAGE`` and ``BACKFILL_KILL_AT`` (crash drills only)."""
        return FaultHooks(kill_after_usage=self.kill_after_usage, kill_at=self.kill_at)

    def model_resource(self) -> ModelResource:
        """The model resource selected by ``BACKFILL_MODEL_BACKEND`` (default: fake)."""
        if self.model_backend == "fake":
            return FakeModelResource(
                model=self.model or "fake-moderator-1",
                latency_ms=self.fake_latency_ms,
                failure_rate=self.fake_failure_rate,
                malformed_rate=self.fake_malformed_rate,
                overbill_factor=self.fake_overbill_factor,
                usage_shape=self.fake_usage_shape,
            )
        return OpenAIModelResource(
            model=self.model or DEFAULT_OPENAI_MODEL,
            base_url=self.model_base_url,
            # The key itself never enters the config: Dagster resolves the variable at run time.
            api_key=dg.EnvVar(API_KEY_VAR) if self.api_key_set else "",
            region_base_urls=self.region_base_urls,
            rpm=self.rpm,
            tpm=self.tpm,
            retry_after_max_s=self.retry_after_max_seconds,
            adaptive=self.adaptive,
            share_limit=self.share_limit,
            trust_limit_headers=self.trust_limit_headers,
            connect_timeout_s=self.http_connect_timeout_s,
            read_timeout_s=self.http_read_timeout_s,
            total_timeout_s=self.http_total_timeout_s,
            max_tokens_param=self.max_tokens_param,
            service_tier=self.service_tier,
            flex_fallback=self.flex_fallback,
            flex_fallback_after_s=self.flex_fallback_after_s,
            prices_json=self.prices_json,
        )

    def checks(self) -> ChecksResource:
        """``BACKFILL_CHECK_*``, ``BACKFILL_DRIFT_*`` and ``BACKFILL_APPLY_LIVE``."""
        fields = {
            "max_rebilled_share": self.check_max_rebilled_share,
            "max_orphan_attempts": self.check_max_orphan_attempts,
            "max_tokens_per_key": self.check_max_tokens_per_key,
            "max_over_bound_calls": self.check_max_over_bound_calls,
            "drift_baseline": self.drift_baseline,
            "drift_labels": self.drift_labels,
            "drift_factor": self.drift_factor,
            "drift_min_count": self.drift_min_count,
            "apply_live": self.apply_live,
        }
        return ChecksResource(**{k: v for k, v in fields.items() if v is not None})  # type: ignore[arg-type]

    def source(self) -> SqlSource | None:
        """The posts asset's database source, if ``BACKFILL_SOURCE_URL`` names one."""
        if not self.source_url:
            return None
        return SqlSource(
            url=self.source_url,
            query=self.source_query,
            name=ENV_SOURCE_NAME,
            cursor=self.source_cursor or None,
        )

    def sink(self) -> Sink | None:
        """Where ``applied_labels`` writes labels back, if ``BACKFILL_SINK_URL`` is set."""
        if not self.sink_url:
            return None
        return Sink(url=self.sink_url, table=self.sink_table, batch=self.sink_batch)

    def prices(self) -> PriceTable:
        """The price table: built-in list prices merged with ``BACKFILL_PRICES``."""
        return PriceTable.from_json(self.prices_json)

    def versions(self) -> Versions:
        """The versions (and so the code version) these settings select."""
        return versions_for(self.model_resource(), self.rubric())

    def resources(self) -> dict[str, Any]:
        """All resources the definitions need."""
        return {
            "store": StoreResource(
                database_url=self.store_url, dead_peer_seconds=self.pg_dead_peer_seconds
            ),
            "model": self.model_resource(),
            "settings": self.run_settings(),
            "checks": self.checks(),
        }


class _MappingSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._env = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return dict(self._env)


# Messages of pydantic's type errors, in the words the CLI has always used.
_TYPE_WORDS = {
    "int_parsing": "is not an integer",
    "int_from_float": "is not an integer",
    "float_parsing": "is not a number",
    "bool_parsing": "is not a boolean",
}


def _describe(err: Any) -> str:
    """One validation error as ``VARIABLE='value': what is wrong``."""
    loc = err.get("loc") or ()
    msg = str(err.get("msg", "")).removeprefix("Value error, ")
    if not loc:
        return msg
    name, raw = loc[0], err.get("input")
    if isinstance(raw, str) and ("URL" in str(name) or "://" in raw):
        raw = redact_url(raw)  # a URL may carry a password: never echoed
    shown = repr(raw[:60] if isinstance(raw, str) else raw)
    if err.get("type") in _TYPE_WORDS:
        return f"{name}={shown} {_TYPE_WORDS[err['type']]}"
    if msg == "is not a boolean":
        return f"{name}={shown} {msg}"
    return f"{name}={shown}: {msg}"


def region_base_urls(env: Mapping[str, str]) -> dict[str, str]:
    """``BACKFILL_MODEL_BASE_URL__<REGION>`` -> {region: base URL}; empty values are unset.

    Their keys (``BACKFILL_MODEL_API_KEY__<REGION>``) are not read here: the adapter resolves
    them by name at run time, so no key ever enters the Dagster config.
    """
    prefix = f"{BASE_URL_VAR}__"
    out: dict[str, str] = {}
    for name, value in env.items():
        if not name.startswith(prefix) or not value.strip():
            continue
        try:
            region = region_of_suffix(name[len(prefix) :])
        except InvalidRegion as exc:
            raise SettingsError(f"{name}: {exc}") from None
        try:
            out[region] = checked_model_url(value.strip())
        except ValueError as exc:
            raise SettingsError(f"{name}: {exc}") from None
    return dict(sorted(out.items()))


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
