"""Every setting is declared once, in the group of its section; ``Settings.from_env`` reads each
from its variable with the group's default and bounds, and every resource holds the groups it
needs (the same objects), never copies of their fields."""

from __future__ import annotations

import ast
import asyncio
from collections import Counter
from pathlib import Path

import pytest

from backfill_assets.config.settings import Settings, SettingsError
from backfill_assets.config.variables import GROUPS
from backfill_assets.defs.model_resources import OpenAIModelResource, model_resource
from backfill_assets.defs.resources import RunResource, resources
from backfill_assets.providers.models.llama_guard import LlamaGuardModel
from backfill_assets.providers.models.openai_moderation import OpenAIModerationModel
from backfill_assets.providers.models.safeguard import SafeguardModel
from backfill_tests.domain.test_moderation_dialect import BASE, MAPPING

PACKAGE = Path(__file__).resolve().parents[2] / "backfill_assets"

# A valid value other than the default for every field of the run and batch groups
# (dispatch: batch needs a Batch API, below).
CHANGED = {
    ("run", "concurrency"): ("BACKFILL_CONCURRENCY", "9", 9),
    ("run", "tenant_budget_tokens"): ("BACKFILL_TENANT_BUDGET_TOKENS", "1000", 1000),
    ("run", "max_attempts"): ("BACKFILL_MAX_ATTEMPTS", "6", 6),
    ("run", "retry_base_seconds"): ("BACKFILL_RETRY_BASE_SECONDS", "0.25", 0.25),
    ("run", "retry_max_seconds"): ("BACKFILL_RETRY_MAX_SECONDS", "12", 12.0),
    ("http", "retry_after_max_seconds"): ("BACKFILL_RETRY_AFTER_MAX_SECONDS", "60", 60.0),
    ("run", "flush_ms"): ("BACKFILL_FLUSH_MS", "50", 50.0),
    ("run", "slice_target_posts"): ("BACKFILL_SLICE_TARGET_POSTS", "700", 700),
    ("batch", "batch_max_lines"): ("BACKFILL_BATCH_MAX_LINES", "100", 100),
    ("batch", "batch_max_output_bytes"): ("BACKFILL_BATCH_MAX_OUTPUT_BYTES", "4096", 4096),
    ("batch", "batch_poll_seconds"): ("BACKFILL_BATCH_POLL_SECONDS", "5", 5.0),
    ("batch", "batch_create_lookup_seconds"): ("BACKFILL_BATCH_CREATE_LOOKUP_SECONDS", "30", 30.0),
    ("data", "import_dir"): ("BACKFILL_IMPORT_DIR", "/srv/exports", "/srv/exports"),
}


def test_every_run_setting_is_read_once_and_handed_on() -> None:
    settings = Settings.from_env({var: raw for var, raw, _v in CHANGED.values()})
    for (group, name), (_var, _raw, value) in CHANGED.items():
        assert getattr(getattr(settings, group), name) == value, (group, name)
    held = RunResource.of(settings)
    # The resource holds the groups themselves: nothing copied, nothing renamed on the way.
    assert (held.run, held.batch, held.http, held.data) == (
        settings.run,
        settings.batch,
        settings.http,
        settings.data,
    )
    assert held.run is settings.run and held.batch is settings.batch
    built = resources(settings)
    assert built["store"] is settings.store and built["checks"] is settings.checks
    options = held.run_options()
    assert options.concurrency == 9 and options.retry.retry_after_max_seconds == 60.0
    assert options.run is settings.run


def test_the_model_resource_holds_the_model_and_http_groups() -> None:
    settings = Settings.from_env(
        {"BACKFILL_MODEL_BACKEND": "openai", "BACKFILL_RPM": "600", "BACKFILL_MODEL": "m"},
        load_policy=False,
    )
    model = model_resource(settings)
    assert isinstance(model, OpenAIModelResource)
    assert model.settings is settings.model and model.http is settings.http
    assert model.limiter_config().http is settings.http and model.model == "m"
    # The adapter and the batch endpoint take the same groups, not copies of their fields.
    assert model.batch_endpoint().http is settings.http
    assert model.batch_endpoint().settings is settings.model


def test_every_variable_is_declared_in_exactly_one_group() -> None:
    variables = Counter(v for g in GROUPS.values() for v in g.variables().values())
    assert [v for v, n in variables.items() if n > 1] == []
    assert len(variables) > 60


def test_no_resource_copies_settings_into_dagster_config() -> None:
    """Resources hold groups: none is a ``ConfigurableResource`` or ``Config`` whose fields
    would repeat the variables' declarations (and become run config a launch could set)."""
    copying = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b) for b in node.bases}
                if bases & {"dg.ConfigurableResource", "dg.Config", "ConfigurableResource"}:
                    copying.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    assert copying == []


@pytest.mark.parametrize(
    ("var", "raw"),
    [("BACKFILL_CONCURRENCY", "0"), ("BACKFILL_FLUSH_MS", "5000"), ("BACKFILL_DISPATCH", "x")],
)
def test_the_groups_bounds_refuse_a_variable_by_name(var: str, raw: str) -> None:
    with pytest.raises(SettingsError, match=var):
        Settings.from_env({var: raw})


def _dialect_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    policy = tmp_path / "forum.yaml"
    policy.write_text(BASE + MAPPING, encoding="utf-8")
    return {
        "BACKFILL_MODEL_DIALECT": "openai-moderation",
        "BACKFILL_MODEL_BACKEND": "openai",
        "BACKFILL_MODEL": "omni-moderation-latest",
        "BACKFILL_POLICY_PATH": str(policy),
        **extra,
    }


def test_the_moderation_dialect_builds_its_adapter_from_the_same_groups(tmp_path: Path) -> None:
    settings = Settings.from_env(_dialect_env(tmp_path))
    rubric = settings.rubric()
    assert rubric.dialect == "openai-moderation"
    versions = settings.versions()
    assert versions.key_version.endswith("+openai-moderation")
    # The section is not sent: it names no work, only how answers are read (the code version).
    assert versions.mapping == rubric.policy.mapping_version != ""
    assert f"mapping={versions.mapping}" in versions.code_version
    model = model_resource(settings)
    adapter = model.build_adapter()
    assert isinstance(adapter, OpenAIModerationModel) and adapter.path == "/moderations"
    assert model.price_table().cost("omni-moderation-latest", 1000, 1000) == 0
    asyncio.run(adapter.aclose())


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"BACKFILL_MODEL_BACKEND": "fake"}, "needs BACKFILL_MODEL_BACKEND=openai"),
        ({"BACKFILL_SERVICE_TIER": "flex"}, "no flex tier"),
        ({"BACKFILL_MODEL_DIALECT": "llama-guardian"}, "BACKFILL_MODEL_DIALECT"),
    ],
)
def test_what_the_moderation_dialect_cannot_do_is_refused_by_name(
    tmp_path: Path, extra: dict[str, str], why: str
) -> None:
    with pytest.raises(SettingsError, match=why):
        Settings.from_env(_dialect_env(tmp_path, **extra))


def test_the_moderation_dialect_needs_the_policys_section(tmp_path: Path) -> None:
    env = _dialect_env(tmp_path)
    Path(env["BACKFILL_POLICY_PATH"]).write_text(BASE, encoding="utf-8")
    with pytest.raises(SettingsError, match="no dialects: openai-moderation: section"):
        Settings.from_env(env)


@pytest.mark.parametrize(
    ("dialect", "extra", "adapter", "variant"),
    [
        ("llama-guard", {}, LlamaGuardModel, "+llama-guard@3"),
        ("llama-guard", {"BACKFILL_LLAMA_GUARD_VERSION": "4"}, LlamaGuardModel, "+llama-guard@4"),
        ("safeguard", {}, SafeguardModel, "+safeguard@medium"),
        ("safeguard", {"BACKFILL_REASONING_EFFORT": "high"}, SafeguardModel, "+safeguard@high"),
    ],
)
def test_each_guard_dialect_builds_its_adapter_and_names_its_variant(
    tmp_path: Path, dialect: str, extra: dict[str, str], adapter: type, variant: str
) -> None:
    env = _dialect_env(tmp_path, BACKFILL_MODEL_DIALECT=dialect, BACKFILL_ALLOW_UNPRICED="1")
    settings = Settings.from_env({**env, **extra})
    assert variant in settings.versions().key_version
    built = model_resource(settings).build_adapter()
    assert isinstance(built, adapter)
    if dialect == "safeguard":
        assert isinstance(built, SafeguardModel)
        assert built.reasoning_effort == extra.get("BACKFILL_REASONING_EFFORT", "medium")
        # The generous bound is what a call reserves.
        assert settings.rubric().max_output_tokens == 8192
    asyncio.run(built.aclose())


@pytest.mark.parametrize("dialect", ["llama-guard", "safeguard"])
def test_vllm_dialects_refuse_batch_mode_by_name(tmp_path: Path, dialect: str) -> None:
    env = _dialect_env(tmp_path, BACKFILL_MODEL_DIALECT=dialect, BACKFILL_DISPATCH="batch")
    with pytest.raises(SettingsError, match="no Batch API: unset BACKFILL_DISPATCH"):
        Settings.from_env(env)
