"""The environment, read once: ``Settings.from_env`` parses and checks every variable.

The CLI's entry point and ``definitions.py`` are the only callers; everything below them is
handed a group of the ``Settings`` (``settings.store``, ``settings.run``, ...) or what one
builds. A bad value is a ``SettingsError`` that names the variable (the CLI exits 2 on it).

Variables whose names carry a region (``BACKFILL_MODEL_BASE_URL__<REGION>``) are read
explicitly, and no API key is ever read here: the adapters resolve keys by name at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from backfill_assets.config.stages import Stages, StagesInvalid, load_stages, stage_variables
from backfill_assets.config.urls import checked_model_url
from backfill_assets.config.variables import (
    GROUPS,
    BatchSettings,
    ChecksSettings,
    DataSettings,
    DrillSettings,
    HttpSettings,
    ModelSettings,
    OrchestrationSettings,
    RunSettings,
    StoreSettings,
)
from backfill_assets.domain.cascade import Cascade, CascadeInvalid, load_cascade
from backfill_assets.domain.checks.drift_baseline import (
    LIVE_BASELINE,
    BaselineError,
    parse_baseline,
    unknown_labels,
)
from backfill_assets.domain.money.prices import PriceError, PriceTable
from backfill_assets.domain.policy.evaluation import Gate
from backfill_assets.domain.policy.file import PolicyInvalid, builtin_policy, load_policy
from backfill_assets.domain.policy.rubric import TASK_VERSION, Rubric
from backfill_assets.domain.urls import redact_url
from backfill_assets.domain.work.keys import Versions
from backfill_assets.domain.work.regions import (
    API_KEY_VAR,
    BASE_URL_VAR,
    InvalidRegion,
    region_of_suffix,
)


class SettingsError(ValueError):
    """An environment variable with a value we cannot use."""


_MAX_PRICES_BYTES = 1 << 20


def _read_prices_file(env: Mapping[str, str]) -> Mapping[str, str]:
    """``BACKFILL_PRICES_PATH``: the price table's JSON from a file, as if in BACKFILL_PRICES."""
    path = (env.get("BACKFILL_PRICES_PATH") or "").strip()
    if not path:
        return env
    if (env.get("BACKFILL_PRICES") or "").strip():
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
    return {**env, "BACKFILL_PRICES": text}


class Settings(BaseModel):
    """Every variable the product reads, one group per section, and what they decide together:
    the policy in force, the versions naming its work, the evaluation gate."""

    model_config = ConfigDict(frozen=True)

    store: StoreSettings = Field(default_factory=StoreSettings)
    model: ModelSettings = Field(default_factory=ModelSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    run: RunSettings = Field(default_factory=RunSettings)
    orchestration: OrchestrationSettings = Field(default_factory=OrchestrationSettings)
    batch: BatchSettings = Field(default_factory=BatchSettings)
    checks: ChecksSettings = Field(default_factory=ChecksSettings)
    data: DataSettings = Field(default_factory=DataSettings)
    drills: DrillSettings = Field(default_factory=DrillSettings)
    # Set by from_env from variables with dynamic names; the API key itself is never read.
    region_base_urls: dict[str, str] = Field(default_factory=dict)
    api_key_set: bool = False
    _rubric: Rubric | None = PrivateAttr(default=None)
    _stages: Stages | None = PrivateAttr(default=None)

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, load_policy: bool = True) -> Settings:
        """Parse ``env`` (e.g. ``os.environ``) once; ``SettingsError`` names a bad variable.

        The policy file is read and checked here too, unless ``load_policy`` is false (then
        on first use).
        """
        env = _read_prices_file(env)
        groups: dict[str, Any] = {}
        problems: list[str] = []
        for name, group in GROUPS.items():
            try:
                groups[name] = group.from_env(env)
            except ValidationError as exc:
                problems += [_describe(e) for e in exc.errors()]
        if problems:
            raise SettingsError("; ".join(problems[:3]))
        model: ModelSettings = groups["model"]
        _refuse_per_region_model(env)
        cascade = _read_cascade(env, model)
        regions = region_base_urls({k: v for k, v in env.items() if k not in cascade[1]})
        settings = cls(**groups, region_base_urls=regions, api_key_set=bool(env.get(API_KEY_VAR)))
        if settings.batch.dispatch == "batch" and settings.model.model_backend != "openai":
            raise SettingsError("BACKFILL_DISPATCH=batch needs BACKFILL_MODEL_BACKEND=openai")
        _check_dialect(settings)
        if cascade[0] is not None:
            settings._stages = _stages_of(settings, cascade[0], env)
        if load_policy:
            settings._check_policy()
        return settings

    def replace(self, **changes: Mapping[str, Any]) -> Settings:
        """A copy with some fields of some groups changed (``replace(batch={"dispatch":
        "sync"})``); the policy already read is kept."""
        update = {g: getattr(self, g).model_copy(update=dict(v)) for g, v in changes.items()}
        copy = self.model_copy(update=update)
        copy._rubric = self._rubric
        copy._stages = self._stages
        return copy

    def stages(self) -> Stages | None:
        """The cascade in force (``BACKFILL_CASCADE_PATH``), None for one model."""
        return self._stages

    def for_cascade(self, cascade: Cascade, env: Mapping[str, str], what: str) -> Settings:
        """These settings with ``cascade`` in force instead (``evaluate --cascade FILE``, and the
        file a sweep writes): its stages built from ``env`` as ``from_env`` builds
        ``BACKFILL_CASCADE_PATH``'s, no stage's variables read as a region. ``what``: the name
        a problem is reported under."""
        cascades = [cascade] + ([self._stages.cascade] if self._stages is not None else [])
        owned = stage_variables(env, [s.env_suffix for c in cascades for s in c.stages])
        regions = region_base_urls({k: v for k, v in env.items() if k not in owned})
        copy = self.model_copy(update={"region_base_urls": regions})
        copy._stages = None
        copy._stages = _stages_of(copy, cascade, env, what)
        return copy

    def require_price(self) -> None:
        """For what prices or sends (``run``, ``dry-run``, ``evaluate``, ``launch``, the code
        location's runs): a real provider's model has a price, or SettingsError naming it. The
        fake model bills no one; commands that only read or write the store never ask."""
        if self.model.model_backend != "openai" or self.model.allow_unpriced:
            return
        names = [s.model.name for s in self._stages.stages] if self._stages else [self.model.name]
        for name in names:
            if self.model.prices().price_for(name) is not None:
                continue
            what = "a stage's model" if self._stages else "BACKFILL_MODEL"
            raise SettingsError(
                f"{what} {name!r} has no price: add it to BACKFILL_PRICES (or "
                "the file BACKFILL_PRICES_PATH names) "
                '({"model": {"input": usd_per_1M, "output": usd_per_1M}}), or set '
                "BACKFILL_ALLOW_UNPRICED=1 to book its calls at $0"
            )

    def rubric(self) -> Rubric:
        """The moderation policy in force (``BACKFILL_POLICY_PATH``, else the built-in one),
        compiled; read once, so the keys and the requests of a process use the same text.
        Under a cascade, the labels' rubric (``Stages.rubric``): nothing is sent in it."""
        if self._stages is not None:
            return self._stages.rubric
        if self._rubric is None:
            if not self.model.policy_path:
                policy = builtin_policy()
            else:
                try:
                    policy = load_policy(self.model.policy_path)
                except PolicyInvalid as exc:
                    raise SettingsError(f"BACKFILL_POLICY_PATH: {exc}") from None
            try:
                self._rubric = Rubric(
                    policy,
                    self.model.model_dialect,
                    self.model.dialect_variant,
                    self.model.max_output_tokens,
                )
            except ValueError as exc:
                raise SettingsError(
                    f"BACKFILL_MODEL_DIALECT={self.model.model_dialect}: {exc}"
                ) from None
        return self._rubric

    def versions(self) -> Versions:
        """The versions (and so the code version) these settings select."""
        if self._stages is not None:
            return self._stages.versions
        rubric = self.rubric()
        return Versions(
            TASK_VERSION, rubric.key_version, self.model.name, rubric.policy.mapping_version
        )

    def policy_gate(self) -> Gate | None:
        """The evaluation gate (None: ``BACKFILL_POLICY_MIN_MACRO_F1`` is not set)."""
        if self.model.policy_min_macro_f1 is None:
            return None
        return Gate(self.model.policy_min_macro_f1, self.model.policy_min_support)

    def _check_policy(self) -> None:
        """The policy loads, and the drift settings name its labels (at load, not in a check)."""
        policy = self.rubric().policy
        checks = self.checks
        if checks.drift_labels and (bad := unknown_labels(checks.drift_labels, policy.label_ids)):
            raise SettingsError(
                f"BACKFILL_DRIFT_LABELS={checks.drift_labels[:60]!r}: not labels of policy "
                f"{policy.identity}: {', '.join(bad[:5])}"
            )
        if checks.drift_baseline != LIVE_BASELINE:
            try:
                parse_baseline(checks.drift_baseline, policy.label_ids)
            except BaselineError as exc:
                raise SettingsError(
                    f"BACKFILL_DRIFT_BASELINE={checks.drift_baseline[:60]!r}: {exc}"
                ) from None


# Messages of pydantic's type errors, in the words the CLI has always used.
_TYPE_WORDS = {
    "int_parsing": "is not an integer",
    "int_from_float": "is not an integer",
    "float_parsing": "is not a number",
    "bool_parsing": "is not a boolean",
}


def _check_dialect(settings: Settings) -> None:
    """What the moderation endpoint cannot do is refused at start, by name."""
    dialect = settings.model.model_dialect
    if dialect == "chat-json":
        return
    what = f"BACKFILL_MODEL_DIALECT={dialect}"
    if settings.model.model_backend != "openai":
        raise SettingsError(
            f"{what} needs BACKFILL_MODEL_BACKEND=openai (the fake speaks chat-json)"
        )
    if settings.model.service_tier != "standard":
        raise SettingsError(f"{what} has no flex tier: unset BACKFILL_SERVICE_TIER")
    if dialect in ("llama-guard", "safeguard") and settings.batch.dispatch == "batch":
        raise SettingsError(
            f"{what} is served by vLLM, which has no Batch API: unset BACKFILL_DISPATCH"
        )


# What a region lane cannot change: a lane is the same model and dialect at another endpoint.
_PER_LANE_REFUSED = ("BACKFILL_MODEL_DIALECT__", "BACKFILL_MODEL__")


def _refuse_per_region_model(env: Mapping[str, str]) -> None:
    """A dialect or model per region is refused by name rather than ignored: both are part of
    every key and of the labels' code version, which are one per code location, and a tenant
    must never be labelled by another model than the one its labels claim."""
    for name in sorted(env):
        if name.startswith(_PER_LANE_REFUSED) and env[name].strip():
            raise SettingsError(
                f"{name}: a region lane sends to another endpoint of the same model and "
                "dialect; a model or dialect per region is not supported (both are part of "
                "every key and of the labels' code version). Unset it; to send some posts to "
                "another model, use a cascade (BACKFILL_CASCADE_PATH, docs/cascade.md)"
            )


def _read_cascade(env: Mapping[str, str], model: ModelSettings) -> tuple[Cascade | None, set[str]]:
    """The cascade file (None: one model) and the variables that belong to its stages, which
    are not regions of the default endpoint."""
    if not model.cascade_path:
        return None, set()
    try:
        cascade = load_cascade(model.cascade_path)
    except CascadeInvalid as exc:
        raise SettingsError(f"BACKFILL_CASCADE_PATH: {exc}") from None
    return cascade, stage_variables(env, [s.env_suffix for s in cascade.stages])


def _stages_of(
    settings: Settings,
    cascade: Cascade,
    env: Mapping[str, str],
    what: str = "BACKFILL_CASCADE_PATH",
) -> Stages:
    """The cascade's stages; what a cascade cannot do yet is refused by name."""
    if settings.model.model_backend != "openai":
        raise SettingsError(f"{what} needs BACKFILL_MODEL_BACKEND=openai")
    served_by_vllm = [s for s in cascade.stages if s.dialect in ("llama-guard", "safeguard")]
    if settings.batch.dispatch == "batch" and served_by_vllm:
        raise SettingsError(
            f"{what}: stage {served_by_vllm[0].name} ({served_by_vllm[0].dialect}) is served by "
            "vLLM, which has no Batch API: unset BACKFILL_DISPATCH"
        )
    if settings.model.service_tier != "standard":
        raise SettingsError(
            f"{what}: a cascade runs at the standard tier: unset BACKFILL_SERVICE_TIER"
        )
    policy = settings.rubric().policy
    try:
        return load_stages(cascade, env, settings.model, policy, settings.region_base_urls)
    except StagesInvalid as exc:
        raise SettingsError(f"{what}: {exc}") from None


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
