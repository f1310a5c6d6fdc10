"""Partition keys are validated wherever they enter: a bad tenant id never becomes a path.

The defect: the partition key ``s00|../../escaped`` (a dynamic partition anyone can add in the
UI) ran, and created ``escaped.s00.lock`` two folders above the lock folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.config.variables import StoreSettings
from backfill_assets.definitions import APPLY_JOB, BACKFILL_JOB, build_definitions
from backfill_assets.defs.partitions import (
    InvalidPartitionKey,
    partition_key_for,
    partition_ref,
    tenant_partition_keys,
)
from backfill_assets.defs.sensors import tenant_partitions_sensor
from backfill_assets.dispatch.pipeline import PartitionRef
from backfill_assets.domain.work.keys import MAX_LEVEL, SLICE_KEYS, InvalidTenantId
from backfill_assets.ledger.locks import sqlite_files
from backfill_assets.ledger.locks.fence import PartitionBusy
from backfill_assets.ledger.locks.writer_locks import WriterLocks
from backfill_assets.runner.launch import DagsterClient, select_partitions
from backfill_assets.runner.orchestrate import materialize
from backfill_tests.conftest import import_records

BAD = "../../escaped"
BAD_KEY = f"s00|{BAD}"


def tree(root: Path) -> set[str]:
    """Every path under ``root`` (the Dagster instance's own folder aside)."""
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if "dagster" not in p.relative_to(root).parts
    }


def store_dump(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, so "touched nothing" can be compared exactly."""
    with engine.connect() as conn:
        names = sa.inspect(conn).get_table_names()
        return {
            n: sorted(map(tuple, conn.execute(sa.text(f"SELECT * FROM {n}"))), key=repr)
            for n in names
        }


def step_errors(result: dg.ExecuteInProcessResult) -> str:
    """The text of every step failure of a run."""
    return " ".join(
        str(e.event_specific_data)
        for e in result.all_events
        if e.event_type_value == "STEP_FAILURE"
    )


@pytest.fixture
def loaded(engine: Engine, tmp_path: Path) -> Engine:
    import_records(engine, tmp_path, [{"tenant_id": "acme", "post_id": "p1", "text": "hello"}])
    return engine


@pytest.mark.parametrize("job", [BACKFILL_JOB, APPLY_JOB])
def test_a_bad_partition_key_fails_the_run_and_creates_nothing(
    loaded: Engine, store_url: str, tmp_path: Path, job: str
) -> None:
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    instance.add_dynamic_partitions("tenant_slices", [BAD_KEY])
    files, rows = tree(tmp_path.parent), store_dump(loaded)
    defs = build_definitions({"BACKFILL_DATABASE_URL": store_url})
    result = defs.resolve_job_def(job).execute_in_process(
        instance=instance, partition_key=BAD_KEY, raise_on_error=False
    )
    assert not result.success
    assert "invalid tenant id '../../escaped'" in step_errors(result)
    assert "nothing was done" in step_errors(result)
    assert result.get_asset_materialization_events() == []
    assert tree(tmp_path.parent) == files  # no lock file, inside .locks or outside
    assert not (tmp_path.parent / "escaped.s00.lock").exists()
    assert store_dump(loaded) == rows
    instance.dispose()


def test_materialize_refuses_a_bad_tenant_before_registering_it(
    store_url: str, tmp_path: Path
) -> None:
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    defs = build_definitions({"BACKFILL_DATABASE_URL": store_url})
    with pytest.raises(InvalidTenantId):
        materialize(defs, instance, BACKFILL_JOB, ["acme", BAD], ["s00"])
    with pytest.raises(ValueError, match="unknown slice"):
        materialize(defs, instance, BACKFILL_JOB, ["acme"], ["s16"])
    assert instance.get_dynamic_partitions("tenant_slices") == []
    instance.dispose()


def test_the_sensor_registers_only_valid_tenant_ids(
    loaded: Engine, store_url: str, tmp_path: Path
) -> None:
    with loaded.begin() as conn:
        for bad in (BAD, "Acme Corp", "x" * 41):
            conn.execute(
                sa.text(
                    "INSERT INTO tenants (tenant_id, billed_tokens, created_at)"
                    " VALUES (:t, 0, CURRENT_TIMESTAMP)"
                ),
                {"t": bad},
            )
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    ctx = dg.build_sensor_context(
        instance=instance, resources={"store": StoreSettings(database_url=store_url)}
    )
    result = tenant_partitions_sensor(ctx)
    assert isinstance(result, dg.SensorResult)
    (request,) = result.dynamic_partitions_requests or []
    # Imported with every tenant at the top level: its 16 partitions, and nothing else.
    assert list(request.partition_keys) == tenant_partition_keys("acme", MAX_LEVEL)
    instance.dispose()


def test_partition_keys_are_parsed_strictly() -> None:
    assert partition_ref("s03|acme") == PartitionRef("s03|acme", "acme", 3)
    for bad in (BAD_KEY, "s00|Acme", "s16|acme", "acme|s00", "s00", "s00|acme|x", "s00|"):
        with pytest.raises(InvalidPartitionKey):
            partition_ref(bad)
    with pytest.raises(InvalidTenantId):
        PartitionRef("x", BAD, 0)
    with pytest.raises(ValueError):
        PartitionRef("x", "acme", 16)


def test_the_launcher_never_selects_or_launches_a_bad_key() -> None:
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body: dict[str, Any] = json.loads(request.content)
        sent.append(body["query"])
        query, variables = body["query"], body["variables"]
        if "staleStatusByPartition" in query:
            node = {"staleStatusByPartition": ["MISSING" for _ in variables["partitions"]]}
        elif "assetChecksOrError" in query:
            node = {"assetChecksOrError": {"__typename": "AssetChecks", "checks": []}}
        else:
            node = {
                "__typename": "AssetNode",
                "partitionKeys": ["s00|acme", BAD_KEY, "s01|acme"],
                "assetPartitionStatuses": {"ranges": []},
            }
        return httpx.Response(200, json={"data": {"assetNodeOrError": node}})

    client = DagsterClient("http://dagster.test", transport=httpx.MockTransport(handler))
    state = client.partition_state()
    assert state.keys == ["s00|acme", "s01|acme"] and state.invalid == [BAD_KEY]
    assert select_partitions(state, missing=True) == ["s00|acme", "s01|acme"]
    sent.clear()
    with pytest.raises(InvalidPartitionKey):
        client.launch_backfill(["s00|acme", BAD_KEY], "t", {"tenant": "acme"})
    assert sent == []  # refused before any request
    client.close()


def test_writer_locks_refuse_bad_ids_and_create_no_file(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'store.db'}")
    with WriterLocks(engine) as locks:
        for tenant, slice_no in ((BAD, 0), ("Acme", 0), ("acme", 16), ("acme", -1)):
            with pytest.raises(ValueError):
                locks.acquire(tenant, slice_no)
    assert list(tmp_path.iterdir()) == []


def test_one_sqlite_file_is_one_lock_folder_whatever_its_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tmp_path / "data" / "store.db"
    real.parent.mkdir()
    real.touch()
    (tmp_path / "link.db").symlink_to(real)
    monkeypatch.chdir(real.parent)
    urls = [f"sqlite:///{real}", "sqlite:///store.db", f"sqlite:///{tmp_path / 'link.db'}"]
    with WriterLocks(sa.create_engine(urls[0])) as first:
        first.acquire("acme", 3)
        for url in urls[1:]:
            with WriterLocks(sa.create_engine(url)) as other, pytest.raises(PartitionBusy):
                other.acquire("acme", 3)
    assert not (tmp_path / "link.db.locks").exists()


@pytest.fixture(params=["one file", "file per partition"])
def lock_files(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a SQLite file's partitions are locked: byte ranges of one file (Linux) and a
    file per partition (where OFD locks do not exist)."""
    if request.param == "one file" and not sqlite_files._OFD:
        pytest.skip("no F_OFD_SETLK on this platform")
    monkeypatch.setattr(sqlite_files, "_OFD", request.param == "one file")
    return str(request.param)


def test_a_replaced_lock_file_counts_as_lost(tmp_path: Path, lock_files: str) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'store.db'}")
    with WriterLocks(engine) as locks:
        locks.acquire("acme", 1)
        locks.acquire("acme", 2)
        assert locks.lost() == []
        # Someone cleans up the lock folder; the next writer would lock a fresh file.
        if lock_files == "one file":
            assert os.listdir(tmp_path / "store.db.locks") == ["partitions.lock"]
            os.unlink(tmp_path / "store.db.locks" / "partitions.lock")
            assert locks.lost() == ["acme.s01", "acme.s02"]
        else:
            os.unlink(tmp_path / "store.db.locks" / "acme.s02.lock")
            assert locks.lost() == ["acme.s02"]


_HOLD = """
import sys, time
import sqlalchemy as sa
from backfill_assets.ledger.locks import sqlite_files, writer_locks
sqlite_files._OFD = sys.argv[2] == "one file"
held = writer_locks.WriterLocks(sa.create_engine(sys.argv[1]))
held.acquire("acme", 1)
print("held", flush=True)
time.sleep(60)
"""


def test_a_partition_lock_holds_across_processes_until_its_holder_dies(
    tmp_path: Path, lock_files: str
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with subprocess.Popen(
        [sys.executable, "-c", _HOLD, url, lock_files], stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            with WriterLocks(sa.create_engine(url)) as mine:
                with pytest.raises(PartitionBusy, match="another process"):
                    mine.acquire("acme", 1)
                mine.acquire("acme", 2)  # another partition of the same file is free
                mine.acquire("other", 1)
            holder.kill()  # SIGKILL: the kernel drops the dead holder's locks
            holder.wait()
            with WriterLocks(sa.create_engine(url)) as mine:
                mine.acquire("acme", 1)
        finally:
            holder.kill()


@pytest.mark.parametrize("tenant", ["acme", "t0000", "a", "x" * 40, "9-to-5"])
def test_a_tenants_keys_at_each_level_are_its_first_slices(tenant: str) -> None:
    for level in range(5):
        keys = tenant_partition_keys(tenant, level)
        assert keys == [partition_key_for(tenant, s) for s in SLICE_KEYS[: 1 << level]]
        for number, key in enumerate(keys):
            assert partition_ref(key) == PartitionRef(key, tenant, number)
    with pytest.raises(InvalidTenantId):
        tenant_partition_keys("Bad Tenant", 0)
