"""The model resources: the fake model and the OpenAI-compatible backend, each holding the
settings groups it needs (``ModelSettings``, ``HttpSettings``; the fake's hostile modes in
``DrillSettings``), and the versions that name their work."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field

import dagster as dg

from backfill_assets.config.settings import Settings
from backfill_assets.config.stages import CASCADE_MODEL, Stage, Stages
from backfill_assets.config.variables import DrillSettings, HttpSettings, ModelSettings
from backfill_assets.dispatch.cascade_run import StageRun
from backfill_assets.dispatch.partition_run import Lanes
from backfill_assets.domain.money.prices import PriceTable
from backfill_assets.domain.policy.rubric import TASK_VERSION, Rubric
from backfill_assets.domain.work.keys import Versions
from backfill_assets.domain.work.regions import (
    API_KEY_VAR,
    InvalidRegion,
    api_key_var,
    env_suffix,
    validate_region,
)
from backfill_assets.ledger.labels.cascade_routes import RouteStage
from backfill_assets.providers.batch_client import BatchEndpoint
from backfill_assets.providers.models.base import ModelAdapter
from backfill_assets.providers.models.fake import FakeModel
from backfill_assets.providers.models.llama_guard import LlamaGuardModel
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.providers.models.openai_moderation import OpenAIModerationModel
from backfill_assets.providers.models.safeguard import SafeguardModel
from backfill_assets.providers.ratelimit import SHARED_LIMITERS, LimiterConfig


@dataclass(frozen=True)
class ModelResource:
    """Base of the model adapters: builds a fresh adapter for each run's event loop."""

    settings: ModelSettings

    @property
    def model(self) -> str:
        """The model's name; part of every key and of the code version."""
        return self.settings.name

    def build_adapter(self) -> ModelAdapter:
        """A new adapter bound to the caller's event loop."""
        raise NotImplementedError

    def batch_endpoint(self) -> BatchEndpoint | None:
        """Where batch mode sends files and batches; None if the backend has no Batch API."""
        return None

    def lanes(self) -> Lanes:
        """Regional endpoints besides the default one (none: regional tenants fail closed)."""
        return Lanes()

    def price_table(self) -> PriceTable:
        """Prices for cost estimates: the list prices merged with ``BACKFILL_PRICES``."""
        return self.settings.prices()


@dataclass(frozen=True)
class FakeModelResource(ModelResource):
    """Deterministic in-process model for demos and tests."""

    drills: DrillSettings = field(default_factory=DrillSettings)

    def lanes(self) -> Lanes:
        """The fake sends nothing anywhere, so it serves every region in-process."""
        return Lanes(any_region=True)

    def build_adapter(self) -> ModelAdapter:
        """A fake model, with the drills' hostile modes."""
        d = self.drills
        return FakeModel(
            model=self.model,
            latency_ms=d.fake_latency_ms,
            failure_rate=d.fake_failure_rate,
            malformed_rate=d.fake_malformed_rate,
            overbill_factor=d.fake_overbill_factor,
            usage_shape=d.fake_usage_shape,
        )


@dataclass(frozen=True)
class OpenAIModelResource(ModelResource):
    """Any OpenAI-compatible chat-completions server (OpenAI, vLLM, Ollama, LiteLLM, ...).

    The key is never held: ``BACKFILL_MODEL_API_KEY`` (and a region's) is read by name from
    the environment of the process that builds the adapter, at run time.
    """

    http: HttpSettings = field(default_factory=HttpSettings)
    # Region -> base URL (BACKFILL_MODEL_BASE_URL__<REGION>); a tenant's region must be here.
    region_base_urls: dict[str, str] = field(default_factory=dict)
    api_key_set: bool = False
    # Connections per adapter: a pool large enough for BACKFILL_CONCURRENCY's most.
    max_connections: int = 256
    # Where the keys are read from: a cascade's stage with its own endpoint has its own.
    api_key_var: str = API_KEY_VAR
    region_key_vars: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A region name is part of a variable's name and of a run tag: checked however the
        # resource was built (Settings.from_env checks the variables' names the same way).
        for region in self.region_base_urls:
            try:
                validate_region(region)
            except InvalidRegion as exc:
                raise ValueError(f"region_base_urls: {exc}") from None

    def limiter_config(self) -> LimiterConfig:
        """The limiter settings of this endpoint."""
        return LimiterConfig(self.http)

    def _default_key(self) -> str:
        return (dg.EnvVar(self.api_key_var).get_value("") or "") if self.api_key_set else ""

    def build_adapter(self) -> ModelAdapter:
        """An HTTP adapter for the default endpoint (tenants without a region)."""
        return self._http_adapter(self.settings.model_base_url, self._default_key())

    def lanes(self) -> Lanes:
        """Each configured region's adapter factory and Batch API endpoint.

        A region's key is resolved here, at run time, from the run process's environment by
        its fixed name; no other endpoint's key is ever sent to a region's URL.
        """
        keys = {
            r: dg.EnvVar(self.region_key_vars.get(r) or api_key_var(r)).get_value("") or ""
            for r in self.region_base_urls
        }
        return Lanes(
            adapters={
                r: functools.partial(self._http_adapter, url, keys[r])
                for r, url in self.region_base_urls.items()
            },
            batch={r: self._batch_at(url, keys[r]) for r, url in self.region_base_urls.items()},
        )

    def _http_adapter(self, base_url: str, api_key: str) -> ModelAdapter:
        """An HTTP adapter sharing the process-wide limiter of this endpoint, model and key."""
        base_url = base_url.rstrip("/")
        m, h = self.settings, self.http
        adapter = ADAPTERS.get(m.model_dialect, OpenAIHttpModel)
        return adapter(
            base_url=base_url,
            model=self.model,
            api_key=api_key,
            # One limiter per account in the process: base URL, model and key (as a hash).
            limiter=SHARED_LIMITERS.get(
                f"{base_url}#{self.model}#{_key_id(api_key)}", self.limiter_config()
            ),
            settings=m,
            http=h,
            max_connections=self.max_connections,
        )

    def batch_endpoint(self) -> BatchEndpoint:
        """The default endpoint's Files and Batches APIs (batch mode)."""
        return self._batch_at(self.settings.model_base_url, self._default_key())

    def _batch_at(self, base_url: str, api_key: str) -> BatchEndpoint:
        return BatchEndpoint(
            base_url=base_url.rstrip("/"),
            model=self.model,
            api_key=api_key,
            settings=self.settings,
            http=self.http,
        )


# The adapter of each dialect but chat-json's (``OpenAIHttpModel``).
ADAPTERS: dict[str, type[OpenAIHttpModel]] = {
    "openai-moderation": OpenAIModerationModel,
    "llama-guard": LlamaGuardModel,
    "safeguard": SafeguardModel,
}


@dataclass(frozen=True)
class CascadeModelResource(ModelResource):
    """A cascade's stages (``BACKFILL_CASCADE_PATH``), each with its own endpoint resource;
    the labels they decide carry the model ``cascade`` (``stages.py``)."""

    stages: Stages | None = None
    endpoints: tuple[OpenAIModelResource, ...] = ()

    @property
    def model(self) -> str:
        """The labels' model column: the deciding stage is in their ``stage``."""
        return CASCADE_MODEL

    def build_adapter(self) -> ModelAdapter:
        """Nothing is sent as the cascade itself: each stage sends through its endpoint."""
        raise RuntimeError("a cascade sends through its stages' endpoints")


def stage_runs(model: CascadeModelResource) -> list[StageRun]:
    """The cascade's stages as a run sends through them (adapters built on the run's loop)."""
    assert model.stages is not None
    return [
        StageRun(
            RouteStage(s.name, s.versions, s.decide, s.rubric.dialect),
            s.rubric,
            endpoint.build_adapter,
            endpoint.lanes(),
            endpoint.price_table(),
            endpoint.batch_endpoint(),
        )
        for s, endpoint in zip(model.stages.stages, model.endpoints, strict=True)
    ]


def stage_models(model: ModelResource) -> list[tuple[str, Rubric, str]] | None:
    """A cascade's stages as an estimate counts them (name, rubric, model), each post through
    all (None: one model)."""
    if not isinstance(model, CascadeModelResource) or model.stages is None:
        return None
    return [(s.name, s.rubric, s.model.name) for s in model.stages.stages]


def _stage_endpoint(settings: Settings, stage: Stage) -> OpenAIModelResource:
    return OpenAIModelResource(
        stage.model,
        settings.http,
        stage.region_base_urls,
        api_key_set=True,
        api_key_var=stage.api_key_var,
        region_key_vars={r: stage.region_key_var(env_suffix(r)) for r in stage.region_base_urls},
    )


def model_resource(settings: Settings) -> ModelResource:
    """The model resource ``BACKFILL_MODEL_BACKEND`` selects (default: the fake)."""
    stages = settings.stages()
    if stages is not None:
        endpoints = tuple(_stage_endpoint(settings, s) for s in stages.stages)
        return CascadeModelResource(settings.model, stages, endpoints)
    if settings.model.model_backend == "fake":
        return FakeModelResource(settings.model, settings.drills)
    return OpenAIModelResource(
        settings.model, settings.http, settings.region_base_urls, settings.api_key_set
    )


def _key_id(api_key: str) -> str:
    """A short, one-way id of an API key (never the key itself)."""
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()[:12]


def versions_for(model: ModelResource, rubric: Rubric) -> Versions:
    """Task, policy and model versions that name the work of ``rubric`` with ``model``."""
    return Versions(TASK_VERSION, rubric.key_version, model.model, rubric.policy.mapping_version)


def run_versions(model: ModelResource, rubric: Rubric, loaded: str | None) -> Versions:
    """A step's versions, which must be the ones the code loaded with.

    ``rubric`` is the policy the definitions loaded (closed over by the asset, so it is the
    one the code version names); ``loaded`` is moderation_labels' code version from the job.
    A model changed in run config, or a step of another code version in the same run, would
    otherwise do work under one version while the UI records another.
    """
    versions = versions_for(model, rubric)
    if loaded is not None and versions.code_version != loaded:
        raise dg.Failure(
            description=(
                f"this run's versions ({versions.code_version}) are not the code version the "
                f"definitions were loaded with ({loaded}): the policy or the model changed "
                "since. Nothing was done. Reload the code location (or restart the command) "
                "so the code version names the work."
            ),
            allow_retries=False,
        )
    return versions
