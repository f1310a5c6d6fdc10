"""Dagster wiring: definitions load, partitions materialise through Dagster's API."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.accelerators import event_rows
from backfill_assets.accelerators.dagster_private import SqlEventLogStorage
from backfill_assets.definitions import APPLY_JOB, BACKFILL_JOB, build_definitions
from backfill_assets.defs import instance_api
from backfill_assets.defs.instance_api import add_partition_metadata
from backfill_assets.defs.labels import applied as applied_module
from backfill_assets.defs.labels import checks as checks_module
from backfill_assets.defs.partitions import (
    PARTITIONS_NAME,
    ensure_partitions,
    listed_once,
    partition_key_for,
    partition_keys,
)
from backfill_assets.dispatch.partition_run import PartitionRef
from backfill_assets.domain.work.keys import MAX_LEVEL, slice_of
from backfill_assets.runner.orchestrate import (
    RANGE_END,
    RANGE_START,
    materialize,
    run_boxes,
    stretches,
)
from backfill_assets.runner.pooling import Box
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import count, verify
from backfill_tests.policy_helpers import COURSE_V5


def env_for(store_url: str, **extra: str) -> dict[str, str]:
    return {"BACKFILL_DATABASE_URL": store_url, **extra}


def test_definitions_load_with_expected_assets() -> None:
    defs = build_definitions({})
    keys = {k.to_user_string() for k in defs.resolve_all_asset_keys()}
    assert {"posts", "moderation_labels"} <= keys
    job = defs.resolve_job_def(BACKFILL_JOB)
    assert job.partitions_def is not None
    dg.Definitions.validate_loadable(defs)


def test_code_version_names_task_prompt_and_model(tmp_path: Path) -> None:
    a = build_definitions({}).resolve_assets_def("moderation_labels")
    b = build_definitions({"BACKFILL_MODEL": "fake-moderator-2"}).resolve_assets_def(
        "moderation_labels"
    )
    c = build_definitions({"BACKFILL_POLICY_PATH": str(COURSE_V5)}).resolve_assets_def(
        "moderation_labels"
    )
    key = dg.AssetKey("moderation_labels")
    va, vb, vc = (d.code_versions_by_key[key] for d in (a, b, c))
    assert va is not None and "model=fake-moderator-1" in va and "task=" in va
    assert vb is not None and "model=fake-moderator-2" in vb
    assert len({va, vb, vc}) == 3
    assert vc is not None and "prompt=course-rubric@5#" in vc


def test_new_code_version_shows_partitions_stale(
    engine: Engine, store_url: str, tmp_path: Path
) -> None:
    import_records(engine, tmp_path, [{"tenant_id": "acme", "post_id": "p1", "text": "hi"}])
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    ensure_partitions(instance, dict.fromkeys(["acme"], MAX_LEVEL))
    pk = partition_key_for("acme", f"s{slice_of('acme', 'p1'):02d}")
    for model in ("fake-moderator-1", "fake-moderator-2"):
        defs = build_definitions(env_for(store_url, BACKFILL_MODEL=model))
        res = defs.resolve_job_def(BACKFILL_JOB).execute_in_process(
            instance=instance, partition_key=pk
        )
        assert res.success
        record = instance.fetch_materializations(
            dg.AssetRecordsFilter(
                asset_key=dg.AssetKey("moderation_labels"), asset_partitions=[pk]
            ),
            limit=1,
        ).records[0]
        event = record.event_log_entry.asset_materialization
        assert event is not None and event.tags is not None
        # The materialisation records the code version it was made with; after a model change
        # the UI compares it with the definitions' version and shows the partition as stale.
        assert model in event.tags.get("dagster/code_version", ""), event.tags
    assert count(engine, "SELECT count(*) FROM results") == 2


def test_materialise_many_partitions_in_few_runs(
    engine: Engine, store_url: str, tmp_path: Path
) -> None:
    recs = [
        {"tenant_id": t, "post_id": f"p{i}", "text": f"post {i}"}
        for t in ("acme", "globex")
        for i in range(64)
    ]
    import_records(engine, tmp_path, recs)
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    defs = build_definitions(env_for(store_url))
    slices = [f"s{i:02d}" for i in range(16)]
    records = materialize(
        defs, instance, BACKFILL_JOB, ["acme", "globex"], slices, log_level="WARNING"
    )
    assert len(records) == 2 and all(r.success for r in records)
    assert sum(len(r.partitions) for r in records) == 32
    md = records[0].metadata[records[0].partitions[0]]
    assert md["outcome_accepted"] == md["posts"] and md["model_calls"] == md["posts"]
    # Each partition carries its own metadata (its own post count), not the run's.
    expected = {partition_key_for(t, f"s{i:02d}"): 0 for t in ("acme", "globex") for i in range(16)}
    for r in recs:
        expected[
            partition_key_for(r["tenant_id"], f"s{slice_of(r['tenant_id'], r['post_id']):02d}")
        ] += 1
    got = {pk: rec.metadata[pk]["posts"] for rec in records for pk in rec.partitions}
    assert got == expected and len(set(got.values())) > 2
    assert verify(engine).as_dict(require_complete=True)["ok"]
    # Dagster knows every partition as materialised.
    done = instance.get_materialized_partitions(dg.AssetKey("moderation_labels"))
    assert len(done) == 32
    if engine.dialect.name == "postgresql":
        # The apply analyses applied_labels first, and the checks the ledger the labels step
        # has just written: without statistics PostgreSQL scans the whole table for every
        # group of partitions (docs/benchmarks.md, "Ten thousand").
        with engine.connect() as conn:
            analysed = dict(
                conn.execute(
                    sa.text(
                        "SELECT relname, last_analyze IS NOT NULL FROM pg_stat_user_tables"
                        " WHERE relname IN ('applied_labels', 'ledger_events')"
                    )
                ).all()
            )
        assert analysed == {"applied_labels": True, "ledger_events": True}


_TOY_PARTS = dg.StaticPartitionsDefinition(["a", "b", "c", "d"])


@dg.asset(partitions_def=_TOY_PARTS)
def _toy(context):  # type: ignore[no-untyped-def]  # Dagster refuses a string annotation
    wanted = context.partition_keys + (["d"] if context.run.tags.get("extra") else [])
    add_partition_metadata(context, {pk: {"which": pk} for pk in wanted})
    return dg.MaterializeResult()


@pytest.mark.parametrize("ours", [True, False], ids=["accelerated", "stock"])
def test_partition_metadata_lands_on_each_partition_of_a_range_run(
    ours: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In one step through the step's accumulator on our instance, the public method on any other.
    monkeypatch.setattr(instance_api, "is_ours", lambda _instance: ours)
    instance = dg.DagsterInstance.ephemeral()
    range_tags = {RANGE_START: "a", RANGE_END: "c"}
    result = dg.materialize([_toy], instance=instance, tags=range_tags)
    mats = result.asset_materializations_for_node("_toy")
    assert {m.partition: m.metadata["which"].value for m in mats} == {"a": "a", "b": "b", "c": "c"}
    # A partition the run does not target is refused, as add_asset_metadata refuses it.
    bad = dg.materialize(
        [_toy], instance=instance, tags={**range_tags, "extra": "1"}, raise_on_error=False
    )
    assert not bad.success


def test_stretches_are_runs_of_consecutive_partitions_of_one_tenant() -> None:
    order = ["s00|a", "s01|a", "s02|a", "s03|a", "s00|b", "s07|a"]
    wanted = ["s00|a", "s01|a", "s03|a", "s02|a", "s07|a", "s00|b", "s09|c"]
    assert stretches(wanted, order) == [
        Box(("s00|a", "s01|a", "s02|a", "s03|a")),  # contiguous in the order, one tenant
        Box(("s00|b",)),
        Box(("s07|a",)),  # registered later, after b: its own run
        Box(("s09|c",)),  # not registered: alone
    ]


def test_the_runs_of_a_command_list_the_dynamic_partitions_once(
    engine: Engine, store_url: str, tmp_path: Path
) -> None:
    # Dagster resolves a range run's keys from every registered key, about ten times a run,
    # and once more when it creates each run: the cost of a run grew with the tenant count
    # (docs/benchmarks.md, ten thousand tenants).
    tenants = [f"t{i:02d}" for i in range(12)]
    recs = [{"tenant_id": t, "post_id": "p1", "text": "post"} for t in tenants]
    import_records(engine, tmp_path, recs)
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    defs = build_definitions(env_for(store_url))
    ensure_partitions(instance, dict.fromkeys(tenants, 0))
    storage = instance.event_log_storage
    reads: list[str] = []
    stock = storage.get_dynamic_partitions

    def counted(partitions_def_name: str) -> Sequence[str]:
        reads.append(partitions_def_name)
        return stock(partitions_def_name)

    storage.get_dynamic_partitions = counted  # type: ignore[method-assign]
    keys = [partition_key_for(t, "s00") for t in tenants]
    boxes = [Box(tuple(keys[i : i + 4])) for i in range(0, 12, 4)]
    recs = run_boxes(defs, instance, BACKFILL_JOB, boxes, log_level="WARNING")
    assert [len(r.partitions) for r in recs if r.success] == [4, 4, 4]
    assert len(reads) == 1, reads
    # Outside a run the instance reads afresh, and sees a key added since.
    assert "get_dynamic_partitions" not in vars(instance)
    instance.add_dynamic_partitions(PARTITIONS_NAME, ["s00|late"])
    assert partition_keys(instance)[-1] == "s00|late" and len(reads) == 2


def test_a_key_added_during_a_run_is_listed_after_it(tmp_path: Path) -> None:
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    instance.add_dynamic_partitions(PARTITIONS_NAME, ["s00|a", "s00|b"])
    with listed_once(instance), listed_once(instance):
        assert partition_keys(instance) == ["s00|a", "s00|b"]
        keys = instance.get_dynamic_partitions(PARTITIONS_NAME)
        assert isinstance(keys, list)
        keys.append("mutated")  # a caller's copy, not the run's list
        instance.add_dynamic_partitions(PARTITIONS_NAME, ["s00|c"])  # through the instance
        assert partition_keys(instance) == ["s00|a", "s00|b", "s00|c"]
        instance.delete_dynamic_partition(PARTITIONS_NAME, "s00|a")
        assert partition_keys(instance) == ["s00|b", "s00|c"]
    assert not {"get_dynamic_partitions", "add_dynamic_partitions"} & set(vars(instance))


def test_the_apply_checks_again_only_what_its_run_did_not_check(
    engine: Engine, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenants = ["acme", "globex", "initech"]
    recs = [{"tenant_id": t, "post_id": f"p{i}", "text": "post"} for t in tenants for i in range(3)]
    import_records(engine, tmp_path, recs)
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    defs = build_definitions(env_for(store_url))
    checked: list[str] = []
    stock = applied_module.check_results_for

    def counted(engine: Engine, ref: PartitionRef, *args: Any, **kwargs: Any) -> Any:
        checked.append(ref.key)
        return stock(engine, ref, *args, **kwargs)

    monkeypatch.setattr(applied_module, "check_results_for", counted)
    # Checked in the same run: the apply takes the run's passed evaluations.
    records = materialize(defs, instance, BACKFILL_JOB, tenants, ["s00"], log_level="WARNING")
    assert all(r.success for r in records) and {pk for r in records for pk in r.applied} == {
        partition_key_for(t, "s00") for t in tenants
    }
    assert checked == []
    # Applied on its own, a later run: the earlier run's passes do not count; each partition is
    # checked again before anything is written.
    again = materialize(defs, instance, APPLY_JOB, tenants, ["s00"], log_level="WARNING")
    assert all(r.success for r in again)
    assert sorted(checked) == sorted(partition_key_for(t, "s00") for t in tenants)


def test_check_targets_read_from_the_rows_match_dagsters_records(
    engine: Engine, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenants = ["acme", "globex"]
    recs = [{"tenant_id": t, "post_id": f"p{i}", "text": "post"} for t in tenants for i in range(3)]
    import_records(engine, tmp_path, recs)
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    defs = build_definitions(env_for(store_url))
    for _ in range(2):  # twice: the latest of two materialisations a partition
        records = materialize(defs, instance, BACKFILL_JOB, tenants, ["s00"], log_level="WARNING")
        assert all(r.success for r in records)
    keys = [partition_key_for(t, "s00") for t in tenants] + ["s00|never"]
    fetched = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("moderation_labels")), limit=100
    ).records
    storage = instance.event_log_storage
    assert isinstance(storage, SqlEventLogStorage)
    parsed = event_rows.materializations(storage, [r.storage_id for r in fetched])
    assert len(parsed) == len(fetched) == 4
    for rec in fetched:
        run_id, timestamp, got_ints = parsed[rec.storage_id]
        mat = rec.asset_materialization
        assert mat is not None
        ints = {k: v.value for k, v in mat.metadata.items() if isinstance(v, dg.IntMetadataValue)}
        assert (run_id, timestamp, got_ints) == (rec.run_id, rec.timestamp, ints)
        assert "model_calls" in got_ints
    # A stock instance: Dagster's public reads.
    direct = checks_module._latest_materializations(instance, keys)
    # Read as on our instance, the rows parsed directly: the same.
    monkeypatch.setattr(instance_api, "is_ours", lambda _instance: True)
    assert checks_module._latest_materializations(instance, keys) == direct
    # A row that does not parse (another Dagster's shape) is read Dagster's way, the same.
    monkeypatch.setattr(event_rows, "materializations", lambda _s, _ids: {})
    assert checks_module._latest_materializations(instance, keys) == direct
    assert direct["s00|never"] == (None, None)
    assert {t.storage_id for t, _d in (direct[k] for k in keys[:2]) if t} == {
        max(r.storage_id for r in fetched if r.partition_key == k) for k in keys[:2]
    }
