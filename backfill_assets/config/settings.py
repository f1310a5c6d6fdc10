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
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr, ValidationError, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource
from sqlalchemy.engine import Engine

from backfill_assets.config.variables import Variables, checked_model_url
from backfill_assets.defs.checks_config import (
    LIVE_BASELINE,
    ChecksConfigError,
    ChecksResource,
    parse_baseline,
    unknown_labels,
)
from backfill_assets.defs.model_resources import (
    FakeModelResource,
    ModelResource,
    OpenAIModelResource,
    versions_for,
)
from backfill_assets.defs.posts.assets import ENV_SOURCE_NAME
from backfill_assets.defs.resources import RunSettings, StoreResource
from backfill_assets.domain.money.prices import PriceError, PriceTable
from backfill_assets.domain.policy.evaluation import Gate
from backfill_assets.domain.policy.file import PolicyInvalid, builtin_policy, load_policy
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.domain.urls import redact_url
from backfill_assets.domain.work.faults import FaultHooks
from backfill_assets.domain.work.keys import Versions
from backfill_assets.domain.work.regions import (
    API_KEY_VAR,
    BASE_URL_VAR,
    InvalidRegion,
    region_of_suffix,
)
from backfill_assets.ledger.engines import engine_for
from backfill_assets.platform_db.sink import Sink
from backfill_assets.platform_db.sql_import import SqlSource

# A source checkout (pyproject.toml beside the package) keeps its Dagster home inside the
# project, as bin/dev does; an installed package has no project to keep it in.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
CHECKOUT = (PROJECT_ROOT / "pyproject.toml").is_file() and (PROJECT_ROOT / "sql").is_dir()


# The model a real provider is asked for when BACKFILL_MODEL is not set.
DEFAULT_OPENAI_MODEL = "gpt-4o-mini"


class SettingsError(ValueError):
    """An environment variable with a value we cannot use."""


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


class Settings(Variables):
    """Every variable the product reads (``Variables``), and what they build: resources, fault
    hooks, the policy in force, versions."""

    # Set by from_env from variables with dynamic names; the API key itself is never read.
    region_base_urls: dict[str, str] = Field(default_factory=dict)
    api_key_set: bool = False
    _rubric: Rubric | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _source_is_whole(self) -> Settings:
        if self.source_url and not self.source_query:
            raise ValueError("BACKFILL_SOURCE_URL is set but BACKFILL_SOURCE_QUERY is not")
        if not self.source_url and (self.source_query or self.source_cursor):
            raise ValueError("BACKFILL_SOURCE_QUERY/_CURSOR are set but BACKFILL_SOURCE_URL is not")
        return self

    @model_validator(mode="after")
    def _batch_needs_a_batch_api(self) -> Settings:
        if self.dispatch == "batch" and self.model_backend != "openai":
            raise ValueError("BACKFILL_DISPATCH=batch needs BACKFILL_MODEL_BACKEND=openai")
        return self

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

    def require_price(self) -> None:
        """For what prices or sends (``run``, ``dry-run``, ``evaluate``, ``launch``, the code
        location's runs): a real provider's model has a price, or SettingsError naming it. The
        fake model bills no one; commands that only read or write the store never ask."""
        if self.model_backend != "openai" or self.allow_unpriced:
            return
        model = self.model or DEFAULT_OPENAI_MODEL
        if self.prices().price_for(model) is None:
            raise SettingsError(
                f"BACKFILL_MODEL {model!r} has no price: add it to BACKFILL_PRICES (or the file "
                "BACKFILL_PRICES_PATH names) "
                '({"model": {"input": usd_per_1M, "output": usd_per_1M}}), or set '
                "BACKFILL_ALLOW_UNPRICED=1 to book its calls at $0"
            )

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

    def policy_gate(self) -> Gate | None:
        """The evaluation gate (None: ``BACKFILL_POLICY_MIN_MACRO_F1`` is not set)."""
        if self.policy_min_macro_f1 is None:
            return None
        return Gate(self.policy_min_macro_f1, self.policy_min_support)

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
    if isinstance(raw, str):
        # A URL may carry a password, and a malformed one need not look like a URL.
        raw = redact_url(raw)
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
