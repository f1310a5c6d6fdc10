"""Environment variables -> resource configuration. Callers pass the environment in."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import ValidationError

from .batch.options import KILL_POINTS, PROVIDER_MAX_LINES
from .faults import FaultHooks
from .keys import DEFAULT_SLICE_TARGET, Versions
from .prices import PriceError, PriceTable
from .regions import BASE_URL_VAR, InvalidRegion, region_of_suffix
from .resources import (
    BackfillSettings,
    FakeModelResource,
    ModelResource,
    OpenAIModelResource,
    StoreResource,
    versions_for,
)

PROJECT_ROOT = Path(__file__).resolve().parents[1]


class SettingsError(ValueError):
    """An environment variable with a value we cannot use."""


def dagster_home(env: Mapping[str, str]) -> Path:
    """``$DAGSTER_HOME``, or ``.dagster_home`` inside the project."""
    return Path(env.get("DAGSTER_HOME") or PROJECT_ROOT / ".dagster_home")


def database_url(env: Mapping[str, str]) -> str:
    """``$BACKFILL_DATABASE_URL``, or a SQLite file in the Dagster home."""
    url = env.get("BACKFILL_DATABASE_URL", "").strip()
    return url or f"sqlite:///{dagster_home(env) / 'backfill.db'}"


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None


def settings_from_env(env: Mapping[str, str]) -> BackfillSettings:
    """Run settings from ``BACKFILL_*`` variables."""
    return BackfillSettings(
        concurrency=_int(env, "BACKFILL_CONCURRENCY", 8),
        tenant_budget_tokens=_int(env, "BACKFILL_TENANT_BUDGET_TOKENS", 0),
        max_attempts=_int(env, "BACKFILL_MAX_ATTEMPTS", 5),
        retry_base_seconds=_float(env, "BACKFILL_RETRY_BASE_SECONDS", 0.5),
        retry_max_seconds=_float(env, "BACKFILL_RETRY_MAX_SECONDS", 30.0),
        retry_after_max_seconds=_float(env, "BACKFILL_RETRY_AFTER_MAX_SECONDS", 900.0),
        flush_ms=_float(env, "BACKFILL_FLUSH_MS", 100.0),
        prompt_path=env.get("BACKFILL_PROMPT_PATH", ""),
        slice_target_posts=_int(env, "BACKFILL_SLICE_TARGET_POSTS", DEFAULT_SLICE_TARGET),
        **batch_settings(env),
    )


def batch_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """``BACKFILL_DISPATCH`` and ``BACKFILL_BATCH_*``, checked."""
    dispatch = env.get("BACKFILL_DISPATCH", "").strip() or "sync"
    if dispatch not in ("sync", "batch"):
        raise SettingsError(f"BACKFILL_DISPATCH={dispatch!r}: expected sync or batch")
    max_lines = _int(env, "BACKFILL_BATCH_MAX_LINES", PROVIDER_MAX_LINES)
    if not 1 <= max_lines <= PROVIDER_MAX_LINES:
        raise SettingsError(f"BACKFILL_BATCH_MAX_LINES must be within 1..{PROVIDER_MAX_LINES}")
    poll = _float(env, "BACKFILL_BATCH_POLL_SECONDS", 30.0)
    if not poll > 0:
        raise SettingsError("BACKFILL_BATCH_POLL_SECONDS must be > 0")
    lookup = _float(env, "BACKFILL_BATCH_CREATE_LOOKUP_SECONDS", 600.0)
    if not lookup >= 0:
        raise SettingsError("BACKFILL_BATCH_CREATE_LOOKUP_SECONDS must be >= 0")
    return {
        "dispatch": dispatch,
        "batch_max_lines": max_lines,
        "batch_poll_seconds": poll,
        "batch_create_lookup_seconds": lookup,
    }


def faults_from_env(env: Mapping[str, str]) -> FaultHooks:
    """``BACKFILL_KILL_AFTER_USAGE`` and ``BACKFILL_KILL_AT`` (crash drills only)."""
    kill_at = env.get("BACKFILL_KILL_AT", "").strip()
    if kill_at and kill_at not in KILL_POINTS:
        raise SettingsError(
            f"BACKFILL_KILL_AT={kill_at!r}: expected one of {', '.join(KILL_POINTS)}"
        )
    after = _int(env, "BACKFILL_KILL_AFTER_USAGE", 0)
    if after < 0:
        raise SettingsError("BACKFILL_KILL_AFTER_USAGE must be >= 0")
    return FaultHooks(kill_after_usage=after, kill_at=kill_at)


def model_from_env(env: Mapping[str, str]) -> ModelResource:
    """The model resource selected by ``BACKFILL_MODEL_BACKEND`` (default: fake)."""
    backend = env.get("BACKFILL_MODEL_BACKEND", "fake").strip() or "fake"
    if backend == "fake":
        return FakeModelResource(
            model=env.get("BACKFILL_MODEL", "").strip() or "fake-moderator-1",
            latency_ms=_float(env, "BACKFILL_FAKE_LATENCY_MS", 0.0),
            failure_rate=_float(env, "BACKFILL_FAKE_FAILURE_RATE", 0.0),
            malformed_rate=_float(env, "BACKFILL_FAKE_MALFORMED_RATE", 0.0),
            overbill_factor=_float(env, "BACKFILL_FAKE_OVERBILL_FACTOR", 1.0),
            usage_shape=env.get("BACKFILL_FAKE_USAGE_SHAPE", "").strip() or "split",
        )
    if backend == "openai":
        return openai_from_env(env)
    raise SettingsError(f"BACKFILL_MODEL_BACKEND={backend!r}: expected one of fake, openai")


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean")


def openai_from_env(env: Mapping[str, str]) -> OpenAIModelResource:
    """``BACKFILL_MODEL_*``, ``BACKFILL_RPM``/``TPM`` and HTTP knobs -> the OpenAI resource."""
    prices = env.get("BACKFILL_PRICES", "")
    try:
        PriceTable.from_json(prices)
    except PriceError as exc:
        raise SettingsError(f"BACKFILL_PRICES: {exc}") from None
    param = env.get("BACKFILL_MAX_TOKENS_PARAM", "").strip() or "max_tokens"
    if param not in ("max_tokens", "max_completion_tokens"):
        raise SettingsError(
            f"BACKFILL_MAX_TOKENS_PARAM={param!r}: max_tokens|max_completion_tokens"
        )
    limits = {name: _int(env, f"BACKFILL_{name.upper()}", 0) for name in ("rpm", "tpm")}
    if min(limits.values()) < 0:
        raise SettingsError("BACKFILL_RPM and BACKFILL_TPM must be >= 0")
    try:
        return _openai_resource(env, limits, param, prices)
    except ValidationError as exc:
        problems = "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors()[:3])
        raise SettingsError(f"BACKFILL_MODEL_BACKEND=openai: {problems}") from None


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
        out[region] = value.strip()
    return dict(sorted(out.items()))


def _openai_resource(
    env: Mapping[str, str], limits: dict[str, int], param: str, prices: str
) -> OpenAIModelResource:
    return OpenAIModelResource(
        model=env.get("BACKFILL_MODEL", "").strip() or "gpt-4o-mini",
        base_url=env.get("BACKFILL_MODEL_BASE_URL", "").strip() or "https://api.openai.com/v1",
        # The key itself never enters the config: Dagster resolves the variable at run time.
        api_key=dg.EnvVar("BACKFILL_MODEL_API_KEY") if env.get("BACKFILL_MODEL_API_KEY") else "",
        region_base_urls=region_base_urls(env),
        rpm=limits["rpm"],
        tpm=limits["tpm"],
        retry_after_max_s=_float(env, "BACKFILL_RETRY_AFTER_MAX_SECONDS", 900.0),
        adaptive=_bool(env, "BACKFILL_ADAPTIVE", True),
        share_limit=_bool(env, "BACKFILL_SHARE_LIMIT", True),
        trust_limit_headers=_bool(env, "BACKFILL_TRUST_LIMIT_HEADERS", True),
        connect_timeout_s=_float(env, "BACKFILL_HTTP_CONNECT_TIMEOUT_S", 5.0),
        read_timeout_s=_float(env, "BACKFILL_HTTP_READ_TIMEOUT_S", 60.0),
        total_timeout_s=_float(env, "BACKFILL_HTTP_TOTAL_TIMEOUT_S", 120.0),
        max_tokens_param=param,
        prices_json=prices,
    )


def resources_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """All resources the definitions need."""
    model, settings = model_from_env(env), settings_from_env(env)
    if settings.dispatch == "batch" and model.batch_endpoint() is None:
        raise SettingsError("BACKFILL_DISPATCH=batch needs BACKFILL_MODEL_BACKEND=openai")
    return {
        "store": StoreResource(database_url=database_url(env)),
        "model": model,
        "settings": settings,
    }


def prices_from_env(env: Mapping[str, str]) -> PriceTable:
    """The price table: built-in list prices merged with ``BACKFILL_PRICES``."""
    try:
        return PriceTable.from_json(env.get("BACKFILL_PRICES", ""))
    except PriceError as exc:
        raise SettingsError(f"BACKFILL_PRICES: {exc}") from None


def versions_from_env(env: Mapping[str, str]) -> Versions:
    """The versions (and so the code version) the environment selects."""
    return versions_for(settings_from_env(env), model_from_env(env))


def partitions_per_run(env: Mapping[str, str]) -> int:
    """How many partitions one backfill run handles."""
    n = _int(env, "BACKFILL_PARTITIONS_PER_RUN", 16)
    if n < 1:
        raise SettingsError("BACKFILL_PARTITIONS_PER_RUN must be at least 1")
    return n


def executor_kind(env: Mapping[str, str]) -> str:
    """``in_process`` (default) or ``multiprocess`` (Dagster's default executor)."""
    kind = env.get("BACKFILL_EXECUTOR", "").strip() or "in_process"
    if kind not in ("in_process", "multiprocess"):
        raise SettingsError(f"BACKFILL_EXECUTOR={kind!r}: expected in_process or multiprocess")
    return kind
