"""A cascade's stages as the settings make them (issue 49): each stage's model settings,
endpoint, rubric and versions, and the versions of the labels the cascade decides.

The file (``BACKFILL_CASCADE_PATH``) names each stage's dialect and model; where a stage sends
is the environment's: ``BACKFILL_MODEL_BASE_URL__<STAGE>`` with ``BACKFILL_MODEL_API_KEY__<STAGE>``
(region lanes ``BACKFILL_MODEL_BASE_URL__<STAGE>__<REGION>``), else the default endpoint, its
key and its region lanes. Keys are never read here: the adapters resolve them by name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from backfill_assets.config.urls import checked_model_url
from backfill_assets.config.variables import ModelSettings
from backfill_assets.domain.cascade import (
    Cascade,
    CascadeStage,
    Decide,
)
from backfill_assets.domain.policy.dialect_sections import CASCADE
from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.policy.rubric import TASK_VERSION, Rubric
from backfill_assets.domain.work.keys import Versions
from backfill_assets.domain.work.regions import (
    API_KEY_VAR,
    BASE_URL_VAR,
    InvalidRegion,
    region_of_suffix,
)

# The model column of the labels a cascade decided: the deciding stage is in their ``stage``.
CASCADE_MODEL = "cascade"


class StagesInvalid(ValueError):
    """A cascade the settings cannot run (the file, or a stage's endpoint variables)."""


@dataclass(frozen=True)
class Stage:
    """One stage as this process runs it."""

    name: str
    decide: Decide | None
    model: ModelSettings
    rubric: Rubric
    versions: Versions
    # The stage's own endpoint variables are set (else it sends where the default one does).
    own_endpoint: bool = False
    region_base_urls: dict[str, str] = field(default_factory=dict)
    env_suffix: str = ""

    @property
    def api_key_var(self) -> str:
        """The variable its default endpoint's key is read from, at run time."""
        return f"{API_KEY_VAR}__{self.env_suffix}" if self.own_endpoint else API_KEY_VAR

    def region_key_var(self, region_suffix: str) -> str:
        """The variable a region lane's key is read from."""
        middle = f"__{self.env_suffix}" if self.own_endpoint else ""
        return f"{API_KEY_VAR}{middle}__{region_suffix}"


@dataclass(frozen=True)
class Stages:
    """The stages in order, and the labels they decide: the cascade's rubric and versions."""

    cascade: Cascade
    stages: tuple[Stage, ...]
    rubric: Rubric
    versions: Versions


def stage_variables(env: Mapping[str, str], suffixes: list[str]) -> set[str]:
    """The endpoint variables that belong to stages (not regions of the default endpoint)."""
    prefixes = [f"{BASE_URL_VAR}__{s}" for s in suffixes]
    return {name for name in env if any(name == p or name.startswith(p + "__") for p in prefixes)}


def load_stages(
    cascade: Cascade,
    env: Mapping[str, str],
    model: ModelSettings,
    policy: Policy,
    default_regions: Mapping[str, str],
) -> Stages:
    """The stages of ``cascade`` built over ``model`` (its shared settings) and ``policy``."""
    stages = tuple(_stage(s, env, model, policy, default_regions) for s in cascade.stages)
    return _labels(cascade, stages, policy)


def _stage(
    spec: CascadeStage,
    env: Mapping[str, str],
    shared: ModelSettings,
    policy: Policy,
    default_regions: Mapping[str, str],
) -> Stage:
    suffix = spec.env_suffix
    own_var = f"{BASE_URL_VAR}__{suffix}"
    own = (env.get(own_var) or "").strip()
    try:
        url = checked_model_url(own) if own else shared.model_base_url
    except ValueError as exc:
        raise StagesInvalid(f"{own_var}: {exc}") from None
    regions = _stage_regions(env, own_var) if own else dict(default_regions)
    model = shared.model_copy(
        update={"model": spec.model, "model_dialect": spec.dialect, "model_base_url": url}
    )
    try:
        rubric = Rubric(policy, spec.dialect, model.dialect_variant, model.max_output_tokens)
    except ValueError as exc:
        raise StagesInvalid(f"stage {spec.name} ({spec.dialect}): {exc}") from None
    versions = Versions(TASK_VERSION, rubric.key_version, model.name, rubric.policy.mapping_version)
    return Stage(spec.name, spec.decide, model, rubric, versions, bool(own), regions, suffix)


def _stage_regions(env: Mapping[str, str], own_var: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in env.items():
        if not name.startswith(own_var + "__") or not value.strip():
            continue
        try:
            region = region_of_suffix(name[len(own_var) + 2 :])
            out[region] = checked_model_url(value.strip())
        except (InvalidRegion, ValueError) as exc:
            raise StagesInvalid(f"{name}: {exc}") from None
    return dict(sorted(out.items()))


def _labels(cascade: Cascade, stages: tuple[Stage, ...], policy: Policy) -> Stages:
    """What names the cascade's labels: every stage's work (their key versions and models) in
    the key version, the decide rules and every stage's mapping in the mapping version."""
    sent = "\n".join(
        f"{s.name}\t{s.versions.task_version}\t{s.versions.key_version}\t{s.versions.model}"
        for s in stages
    )
    routed = "\n".join([cascade.routing_version(), *(s.versions.mapping for s in stages)])
    labels = policy.in_dialect("chat-json").in_cascade(_short(sent), _short(routed))
    bound = max(s.rubric.max_output_tokens for s in stages)
    rubric = Rubric(labels, CASCADE, labels.variant, bound)
    versions = Versions(TASK_VERSION, rubric.key_version, CASCADE_MODEL, labels.mapping_version)
    return Stages(cascade, stages, rubric, versions)


def _short(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
