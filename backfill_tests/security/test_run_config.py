"""No resource takes run config, and the posts asset reads only inside its import directory
(in-process: the definitions' config schema, and the path check on real files)."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
import pytest

from backfill_assets.config.settings import Settings, SettingsError
from backfill_assets.definitions import build_definitions
from backfill_assets.defs.resources import resources
from backfill_assets.ingest.importer import ImportInputError, files_within
from backfill_tests.conftest import write_jsonl
from backfill_tests.security.config_fields import job_config_leaves, nested, resource_fields

ENV = {
    "BACKFILL_DATABASE_URL": "postgresql://u:pw-secret@db/store",
    "BACKFILL_MODEL_BACKEND": "openai",
}


def test_every_job_refuses_config_for_every_resource_field() -> None:
    settings = Settings.from_env(ENV)
    defs = build_definitions(settings)
    fields = {n: list(resource_fields(r)) for n, r in resources(settings).items()}
    assert "database_url" in fields["store"] and "model_base_url" in fields["model"]
    fields["io_manager"] = ["base_dir"]
    for job in defs.resolve_all_job_defs():
        for name, names in fields.items():
            for field in names:
                config = {"resources": {name: {"config": {field: "x"}}}}
                with pytest.raises(dg.DagsterInvalidConfigError, match=f'"{field}"'):
                    dg.validate_run_config(job, config)
        # The deployment's own configuration launches as it is.
        dg.validate_run_config(job, {})


def test_the_job_config_schema_holds_no_deployment_value() -> None:
    job = build_definitions(Settings.from_env(ENV)).resolve_job_def("moderation_backfill")
    snapshot = repr(job.run_config_schema.config_type.fields)
    assert "pw-secret" not in snapshot and "api.openai.com" not in snapshot


def test_posts_reads_only_inside_the_import_directory(tmp_path: Path) -> None:
    root = tmp_path / "imports"
    (root / "nested").mkdir(parents=True)
    inside = write_jsonl(root / "nested" / "a.jsonl", [{"tenant_id": "acme"}])
    outside = write_jsonl(tmp_path / "secret.jsonl", [{"tenant_id": "acme"}])
    assert files_within("nested/a.jsonl", root) == [inside]
    assert files_within(str(inside), root) == [inside]
    assert files_within(".", root / "nested") == [inside]
    os.symlink(outside, root / "link.jsonl")
    os.symlink(tmp_path, root / "up")
    for path in [
        str(outside),
        "../secret.jsonl",
        "nested/../../secret.jsonl",
        "link.jsonl",  # a link out of the directory
        "up/secret.jsonl",
        "/etc/passwd",
    ]:
        with pytest.raises(ImportInputError, match="outside the import directory"):
            files_within(path, root)
    # A directory import whose listing holds a link out is refused as a whole.
    with pytest.raises(ImportInputError, match="outside the import directory"):
        files_within(".", root)


def test_the_import_directory_must_be_absolute() -> None:
    with pytest.raises(SettingsError, match="BACKFILL_IMPORT_DIR"):
        Settings.from_env({"BACKFILL_IMPORT_DIR": "relative/dir"})


# --- No launch can read the run worker's environment (issue 46, item 1) -----------------------

SECRET_VAR = "BACKFILL_MODEL_API_KEY"
SECRET = "sk-proj-only-in-the-worker-env-9f3a"


def every_job_leaf() -> list[tuple[dg.JobDefinition, tuple[str, ...], str]]:
    return job_config_leaves(Settings.from_env(ENV))


def test_no_config_field_a_launch_can_set_is_a_source_or_free_form() -> None:
    leaves = every_job_leaf()
    assert any(path == ("ops", "posts", "config", "path") for _j, path, _k in leaves)
    # A source (StringSource, IntSource, BoolSource) resolves {"env": NAME} in the run
    # worker; an Any field takes whatever a launch sends. Neither may exist.
    loose = [(j.name, ":".join(p), k) for j, p, k in leaves if k in ("SCALAR_UNION", "ANY")]
    assert loose == []


def test_an_env_source_in_any_field_is_refused_and_its_value_never_echoed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SECRET_VAR, SECRET)
    for job, path, _kind in every_job_leaf():
        config = nested(path, {"env": SECRET_VAR})
        with pytest.raises(dg.DagsterInvalidConfigError) as refused:
            dg.validate_run_config(job, config)
        message = str(refused.value)
        assert SECRET not in message, (job.name, path)
        assert path[-1] in message, (job.name, path, message)


def test_the_posts_job_run_in_process_never_reads_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The reproduction from the review: the import job with the key's variable as its path."""
    monkeypatch.setenv(SECRET_VAR, SECRET)
    env = {**ENV, "BACKFILL_DATABASE_URL": f"sqlite:///{tmp_path / 's.db'}"}
    job = build_definitions(Settings.from_env(env)).resolve_job_def("import_posts")
    config = {"ops": {"posts": {"config": {"path": {"env": SECRET_VAR}}}}}
    with pytest.raises(dg.DagsterInvalidConfigError) as refused:
        job.execute_in_process(run_config=config, instance=dg.DagsterInstance.ephemeral())
    assert SECRET not in str(refused.value)


def test_a_refused_posts_path_names_the_field_not_the_value(tmp_path: Path) -> None:
    root = tmp_path / "imports"
    root.mkdir()
    probes = [SECRET, f"/{SECRET}", f"../{SECRET}", f"nested/{SECRET}.jsonl"]
    for probe in probes:
        with pytest.raises(ImportInputError) as refused:
            files_within(probe, root)
        message = str(refused.value)
        assert SECRET not in message, message
        assert "path" in message and "BACKFILL_IMPORT_DIR" in message, message
