"""The model resources: the fake model and the OpenAI-compatible backend, and the versions
that name their work."""

from __future__ import annotations

import functools
import hashlib

import dagster as dg
from pydantic import Field, field_validator

from backfill_assets.dispatch.partition_run import Lanes
from backfill_assets.domain.money.prices import PriceTable, Tier
from backfill_assets.domain.policy.rubric import TASK_VERSION, Rubric
from backfill_assets.domain.work.keys import Versions
from backfill_assets.domain.work.regions import InvalidRegion, api_key_var, validate_region
from backfill_assets.providers.batch_client import BatchEndpoint
from backfill_assets.providers.models.base import ModelAdapter
from backfill_assets.providers.models.fake import FakeModel
from backfill_assets.providers.models.openai_http import HttpTimeouts, OpenAIHttpModel
from backfill_assets.providers.ratelimit import SHARED_LIMITERS, LimiterConfig


class ModelResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Base of the model adapters: builds a fresh adapter for each run's event loop."""

    model: str = Field(description="Model name; part of every key and of the code version.")

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
        """Prices for cost estimates (the built-in list prices unless the backend adds some)."""
        return PriceTable.from_json("")


class FakeModelResource(ModelResource):
    """Deterministic in-process model for demos and tests."""

    model: str = "fake-moderator-1"
    latency_ms: float = Field(default=0.0, description="Added latency per call.")
    failure_rate: float = Field(default=0.0, description="Share of calls failing (retriable).")
    malformed_rate: float = Field(default=0.0, description="Share of keys answered malformed.")
    overbill_factor: float = Field(
        default=1.0, gt=0.0, description="Bill prompt tokens times this (another tokenizer)."
    )
    usage_shape: str = Field(
        default="split",
        pattern="^(split|total|missing)$",
        description="How usage is reported: split, total (total only) or missing (none).",
    )

    def lanes(self) -> Lanes:
        """The fake sends nothing anywhere, so it serves every region in-process."""
        return Lanes(any_region=True)

    def build_adapter(self) -> ModelAdapter:
        """A fake model."""
        return FakeModel(
            model=self.model,
            latency_ms=self.latency_ms,
            failure_rate=self.failure_rate,
            malformed_rate=self.malformed_rate,
            overbill_factor=self.overbill_factor,
            usage_shape=self.usage_shape,
        )


class OpenAIModelResource(ModelResource):
    """Any OpenAI-compatible chat-completions server (OpenAI, vLLM, Ollama, LiteLLM, ...)."""

    model: str = "gpt-4o-mini"
    base_url: str = Field(
        default="https://api.openai.com/v1", description="Base URL; /chat/completions is added."
    )
    api_key: str = Field(
        default="",
        description="Bearer token; wire it as dg.EnvVar(...) so its value is never stored.",
    )
    rpm: int = Field(default=0, ge=0, description="Requests per minute to aim for (0 = unset).")
    tpm: int = Field(default=0, ge=0, description="Tokens per minute to aim for (0 = unset).")
    retry_after_max_s: float = Field(
        default=900.0, gt=0.0, description="Longest Retry-After pause of the endpoint."
    )
    share_limit: bool = Field(
        default=True,
        description="Share rpm/tpm with every process using this account (via the store).",
    )
    adaptive: bool = Field(default=True, description="AIMD on 429s and latency.")
    trust_limit_headers: bool = Field(
        default=True, description="Lower the limits to the provider's x-ratelimit-limit-*."
    )
    connect_timeout_s: float = Field(default=5.0, gt=0.0)
    read_timeout_s: float = Field(default=60.0, gt=0.0)
    total_timeout_s: float = Field(default=120.0, gt=0.0, description="Whole call, end to end.")
    max_connections: int = Field(default=256, ge=1)
    max_tokens_param: str = Field(
        default="max_tokens", description="max_tokens, or max_completion_tokens (newer models)."
    )
    service_tier: str = Field(
        default="standard",
        pattern="^(standard|flex)$",
        description="flex: OpenAI's slower tier at the Batch API's price.",
    )
    flex_fallback: str = Field(
        default="wait",
        pattern="^(wait|standard)$",
        description="When flex has no capacity for flex_fallback_after_s: keep waiting, or send "
        "the rest of the run at the standard tier.",
    )
    flex_fallback_after_s: float = Field(default=600.0, gt=0.0)
    prices_json: str = Field(
        default="", description='Extra prices, USD per 1M tokens: {"model": {"input": .., ..}}.'
    )
    region_base_urls: dict[str, str] = Field(
        default_factory=dict,
        description="Region -> base URL (BACKFILL_MODEL_BASE_URL__<REGION>). A tenant's region "
        "must be here or its work is not sent; its key is read from "
        "BACKFILL_MODEL_API_KEY__<REGION> at run time, never from config.",
    )

    @field_validator("region_base_urls")
    @classmethod
    def _regions_well_formed(cls, value: dict[str, str]) -> dict[str, str]:
        for region in value:
            try:
                validate_region(region)
            except InvalidRegion as exc:
                raise ValueError(f"region_base_urls: {exc}") from None
        return value

    def limiter_config(self) -> LimiterConfig:
        """The limiter settings of this endpoint."""
        return LimiterConfig(
            rpm=self.rpm,
            tpm=self.tpm,
            max_pause_s=self.retry_after_max_s,
            adaptive=self.adaptive,
            trust_limit_headers=self.trust_limit_headers,
        )

    def build_adapter(self) -> ModelAdapter:
        """An HTTP adapter for the default endpoint (tenants without a region)."""
        key = self.api_key
        # Outside a run, Dagster leaves an EnvVar unresolved: read it the same way it would.
        resolved = key.get_value("") if isinstance(key, dg.EnvVar) else key
        return self._http_adapter(self.base_url, resolved or "")

    def lanes(self) -> Lanes:
        """Each configured region's adapter factory and Batch API endpoint.

        A region's key is resolved here, at run time, from the run process's environment by
        its fixed name; no other endpoint's key is ever sent to a region's URL.
        """
        keys = {r: dg.EnvVar(api_key_var(r)).get_value("") or "" for r in self.region_base_urls}
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
        return OpenAIHttpModel(
            base_url=base_url,
            model=self.model,
            api_key=api_key,
            # One limiter per account in the process: base URL, model and key (as a hash).
            limiter=SHARED_LIMITERS.get(
                f"{base_url}#{self.model}#{_key_id(api_key)}", self.limiter_config()
            ),
            prices=PriceTable.from_json(self.prices_json),
            timeouts=HttpTimeouts(
                connect=self.connect_timeout_s,
                read=self.read_timeout_s,
                total=self.total_timeout_s,
            ),
            max_tokens_param=self.max_tokens_param,
            max_connections=self.max_connections,
            share_limit=self.share_limit,
            tier=Tier(self.service_tier),
            flex_fallback=self.flex_fallback,
            fallback_after_s=self.flex_fallback_after_s,
        )

    def price_table(self) -> PriceTable:
        """The list prices merged with ``prices_json``."""
        return PriceTable.from_json(self.prices_json)

    def batch_endpoint(self) -> BatchEndpoint:
        """The default endpoint's Files and Batches APIs (batch mode)."""
        key = self.api_key
        resolved = key.get_value("") if isinstance(key, dg.EnvVar) else key
        return self._batch_at(self.base_url, resolved or "")

    def _batch_at(self, base_url: str, api_key: str) -> BatchEndpoint:
        return BatchEndpoint(
            base_url=base_url.rstrip("/"),
            model=self.model,
            api_key=api_key,
            prices_json=self.prices_json,
            max_tokens_param=self.max_tokens_param,
            connect_timeout_s=self.connect_timeout_s,
            read_timeout_s=self.read_timeout_s,
        )


def _key_id(api_key: str) -> str:
    """A short, one-way id of an API key (never the key itself)."""
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()[:12]


def versions_for(model: ModelResource, rubric: Rubric) -> Versions:
    """Task, policy and model versions that name the work of ``rubric`` with ``model``."""
    return Versions(TASK_VERSION, rubric.prompt_version, model.model)


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
