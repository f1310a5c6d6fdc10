"""Environment -> OpenAI resource -> Dagster run against the simulator; the CLI command."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from backfill_assets.cli.commands.provider_sim import sim_parser
from backfill_assets.config.settings import Settings, SettingsError
from backfill_assets.definitions import BACKFILL_JOB, build_definitions
from backfill_assets.defs.model_resources import (
    FakeModelResource,
    ModelResource,
    OpenAIModelResource,
    model_resource,
)
from backfill_assets.defs.partitions import ensure_partitions, partition_key_for
from backfill_assets.domain.work.keys import MAX_LEVEL, slice_of
from backfill_assets.ledger.engines import engine_for
from backfill_assets.providersim import SimConfig, config_from_args
from backfill_tests.conftest import import_records
from backfill_tests.providers.conftest import API_KEY, StartSim


def _model(env: dict[str, str]) -> ModelResource:
    return model_resource(Settings.from_env(env))


def _env(**extra: str) -> dict[str, str]:
    return {"BACKFILL_MODEL_BACKEND": "openai", **extra}


def test_openai_backend_from_env_keeps_the_key_out_of_config() -> None:
    model = _model(
        _env(
            BACKFILL_MODEL_BASE_URL="http://127.0.0.1:8799/v1/",
            BACKFILL_MODEL_API_KEY=API_KEY,
            BACKFILL_MODEL="gpt-4.1-nano",
            BACKFILL_RPM="3000",
            BACKFILL_TPM="600000",
            BACKFILL_ADAPTIVE="off",
        )
    )
    assert isinstance(model, OpenAIModelResource)
    assert (model.model, model.http.rpm, model.http.tpm, model.http.adaptive) == (
        "gpt-4.1-nano",
        3000,
        600000,
        False,
    )
    # The key is never held: only whether to read BACKFILL_MODEL_API_KEY when an adapter is
    # built, in the process that runs the step.
    assert model.api_key_set
    assert API_KEY not in repr(model) and API_KEY not in str(vars(model))
    assert isinstance(_model({}), FakeModelResource)
    no_key = _model(_env())
    assert isinstance(no_key, OpenAIModelResource) and not no_key.api_key_set


@pytest.mark.parametrize(
    "bad",
    [
        {"BACKFILL_MODEL_BACKEND": "anthropic"},
        _env(BACKFILL_RPM="fast"),
        _env(BACKFILL_TPM="-5"),
        _env(BACKFILL_ADAPTIVE="maybe"),
        _env(BACKFILL_HTTP_TOTAL_TIMEOUT_S="0"),
        _env(BACKFILL_PRICES="{not json"),
        _env(BACKFILL_MAX_TOKENS_PARAM="max_output_tokens"),
    ],
)
def test_bad_openai_settings_are_reported(bad: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        _model(bad)


def test_dagster_run_over_http_resolves_the_key_at_run_time(
    tmp_path: Path, start_sim: StartSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = start_sim(api_key=API_KEY)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = engine_for(url)
    records = [
        {"tenant_id": "acme", "post_id": f"p{i}", "text": f"post number {i}"} for i in range(40)
    ]
    import_records(engine, tmp_path, records)
    monkeypatch.setenv("BACKFILL_MODEL_API_KEY", API_KEY)
    env = _env(
        BACKFILL_DATABASE_URL=url,
        BACKFILL_MODEL_BASE_URL=sim.base_url,
        BACKFILL_MODEL_API_KEY=API_KEY,
        BACKFILL_RPM="6000",
    )
    defs = build_definitions(env)
    code_version = defs.resolve_assets_def("moderation_labels").code_versions_by_key[
        dg.AssetKey("moderation_labels")
    ]
    assert code_version is not None and "model=gpt-4o-mini" in code_version
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    ensure_partitions(instance, dict.fromkeys(["acme"], MAX_LEVEL))
    slice_no = slice_of("acme", "p0")
    result = defs.resolve_job_def(BACKFILL_JOB).execute_in_process(
        instance=instance, partition_key=partition_key_for("acme", f"s{slice_no:02d}")
    )
    assert result.success
    expected = sum(1 for r in records if slice_of("acme", r["post_id"]) == slice_no)
    with engine.connect() as conn:
        done = conn.execute(sa.text("SELECT count(*) FROM results")).scalar_one()
    assert done == expected == sim.meter.snapshot().responses_by_status[200]
    events = "\n".join(str(e) for e in instance.all_logs(result.run_id))
    assert API_KEY not in events


def test_provider_sim_command_parses_the_simulator_options() -> None:
    args = sim_parser().parse_args(
        [
            "--port",
            "8799",
            "--rpm",
            "3000",
            "--tpm",
            "600000",
            "--latency-ms",
            "200",
        ]
    )
    assert args.port == 8799
    assert config_from_args(args) == SimConfig(rpm=3000, tpm=600000, latency_median_ms=200)
