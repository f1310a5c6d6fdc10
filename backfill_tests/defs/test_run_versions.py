"""The policy is read once, where the definitions load, and a run does the work its code
version names.

Before policy files, the labels asset read ``BACKFILL_PROMPT_PATH`` from its resource config
at run time: a UI user could point it at another file, and an edit after the code location
loaded had to be caught by comparing versions inside the step. Now the policy is read from the
environment when the definitions are built and closed over by every asset: no run config can
change it, and an edit to the file takes effect only when the code location reloads.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from sqlalchemy.engine import Engine

from backfill_assets.definitions import BACKFILL_JOB, build_definitions
from backfill_assets.defs.partitions import ensure_partitions, partition_key_for
from backfill_assets.domain.policy.file import load_policy
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.domain.work.keys import MAX_LEVEL, slice_of
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import count
from backfill_tests.policy_helpers import COURSE_V5, edited


@pytest.fixture
def one_post(engine: Engine, tmp_path: Path) -> str:
    import_records(engine, tmp_path, [{"tenant_id": "acme", "post_id": "p1", "text": "hi"}])
    return partition_key_for("acme", f"s{slice_of('acme', 'p1'):02d}")


def _run(
    defs: dg.Definitions, tmp_path: Path, pk: str, run_config: dict[str, object] | None = None
) -> dg.ExecuteInProcessResult:
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    ensure_partitions(instance, dict.fromkeys(["acme"], MAX_LEVEL))
    try:
        return defs.resolve_job_def(BACKFILL_JOB).execute_in_process(
            instance=instance, partition_key=pk, raise_on_error=False, run_config=run_config
        )
    finally:
        instance.dispose()


def test_a_policy_edited_after_loading_changes_nothing_until_reload(
    engine: Engine, store_url: str, tmp_path: Path, one_post: str
) -> None:
    policy = edited(COURSE_V5, tmp_path / "policy.yaml", 'version: "5"', 'version: "5"')
    loaded = Rubric(load_policy(policy))
    defs = build_definitions(
        {"BACKFILL_DATABASE_URL": store_url, "BACKFILL_POLICY_PATH": str(policy)}
    )
    edited(policy, policy, "for money or favours", "for money")  # after the code loaded
    result = _run(defs, tmp_path, one_post)
    assert result.success
    # The work is the loaded policy's: its key version, under the code version that names it.
    assert (
        count(
            engine,
            "SELECT count(*) FROM results WHERE key_version = :v",
            v=loaded.key_version,
        )
        == 1
    )
    assert count(engine, "SELECT count(*) FROM results") == 1
    mat = result.asset_materializations_for_node("moderation_labels")[0]
    assert mat.metadata["policy"].value == loaded.policy.identity
    # Reloaded, the code version names the edited policy, and its work is new.
    again = build_definitions(
        {"BACKFILL_DATABASE_URL": store_url, "BACKFILL_POLICY_PATH": str(policy)}
    )
    key = dg.AssetKey("moderation_labels")
    before = defs.resolve_assets_def("moderation_labels").code_versions_by_key[key]
    after = again.resolve_assets_def("moderation_labels").code_versions_by_key[key]
    assert before != after and loaded.key_version in str(before)


def test_run_config_cannot_name_a_policy_or_prompt_file(
    store_url: str, tmp_path: Path, one_post: str
) -> None:
    defs = build_definitions({"BACKFILL_DATABASE_URL": store_url})
    for field in ("prompt_path", "policy_path"):
        result = None
        with pytest.raises(dg.DagsterInvalidConfigError, match=field):
            result = _run(
                defs,
                tmp_path,
                one_post,
                {"resources": {"settings": {"config": {field: str(COURSE_V5)}}}},
            )
        assert result is None
