"""The prompt file is read once per step, and a run's versions are the definitions' or it fails.

Before: the labels asset read ``BACKFILL_PROMPT_PATH`` twice (once for the versions in the keys,
once for the prompt it sent), so an edit in between sent one prompt under another's keys; and a
prompt edited after the code location loaded only logged a warning while the UI recorded the
old code version.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from sqlalchemy.engine import Engine

from backfill_assets.core.keys import slice_of
from backfill_assets.core.rubric import Rubric
from backfill_assets.definitions import BACKFILL_JOB, build_definitions
from backfill_assets.orchestration.assets import build_moderation_labels
from backfill_assets.orchestration.orchestrate import ensure_tenant_partitions
from backfill_assets.orchestration.partitions import partition_key_for
from backfill_assets.orchestration.resources import (
    FakeModelResource,
    RunSettings,
    StoreResource,
    versions_for,
)
from backfill_assets.providers.models.base import ModelAdapter, ModelRequest, ModelResponse
from backfill_assets.providers.models.fake import FakeModel
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import count

FIRST, SECOND = "Policy, first edition.", "Policy, second edition."
# Test-local records (resources are frozen pydantic models).
READS: list[str] = []
SENT: list[str] = []


class EditedAfterEachRead(RunSettings):
    """The prompt file is edited right after every read: the worst timing for a run."""

    def rubric(self) -> Rubric:
        rubric = super().rubric()
        READS.append(rubric.system_prompt)
        Path(self.prompt_path).write_text(SECOND, encoding="utf-8")
        return rubric


class RecordingModel(FakeModel):
    async def complete(self, request: ModelRequest) -> ModelResponse:
        SENT.append(request.messages[0]["content"])
        return await super().complete(request)


class RecordingModelResource(FakeModelResource):
    def build_adapter(self) -> ModelAdapter:
        return RecordingModel(model=self.model)


@pytest.fixture
def one_post(engine: Engine, tmp_path: Path) -> str:
    import_records(engine, tmp_path, [{"tenant_id": "acme", "post_id": "p1", "text": "hi"}])
    return partition_key_for("acme", f"s{slice_of('acme', 'p1'):02d}")


def test_the_asset_reads_the_prompt_once_and_sends_what_its_keys_name(
    engine: Engine, store_url: str, tmp_path: Path, one_post: str
) -> None:
    READS.clear()
    SENT.clear()
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(FIRST, encoding="utf-8")
    settings = EditedAfterEachRead(prompt_path=str(prompt))
    model = RecordingModelResource()
    loaded = versions_for(RunSettings(prompt_path=str(prompt)), model).code_version
    labels = build_moderation_labels(loaded, 16)
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    ensure_tenant_partitions(instance, ["acme"])
    result = dg.materialize(
        [labels],
        partition_key=one_post,
        instance=instance,
        resources={
            "store": StoreResource(database_url=store_url),
            "model": model,
            "settings": settings,
        },
    )
    assert result.success
    assert READS == [FIRST]  # one read per step
    assert SENT == [FIRST]
    # The stored result's prompt version is the prompt that was sent.
    first = Rubric(system_prompt=FIRST).prompt_version
    assert count(engine, "SELECT count(*) FROM results WHERE prompt_version = :v", v=first) == 1
    instance.dispose()


def test_a_prompt_edited_after_loading_fails_the_run_clearly(
    engine: Engine, store_url: str, tmp_path: Path, one_post: str
) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(FIRST, encoding="utf-8")
    defs = build_definitions(
        {"BACKFILL_DATABASE_URL": store_url, "BACKFILL_PROMPT_PATH": str(prompt)}
    )
    prompt.write_text(SECOND, encoding="utf-8")  # edited after the code location loaded
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    ensure_tenant_partitions(instance, ["acme"])
    result = defs.resolve_job_def(BACKFILL_JOB).execute_in_process(
        instance=instance, partition_key=one_post, raise_on_error=False
    )
    assert not result.success
    errors = " ".join(
        str(e.event_specific_data)
        for e in result.all_events
        if e.event_type_value == "STEP_FAILURE"
    )
    assert "the prompt file or the model changed" in errors
    assert count(engine, "SELECT count(*) FROM ledger_events") == 0
    assert count(engine, "SELECT count(*) FROM results") == 0
    instance.dispose()
