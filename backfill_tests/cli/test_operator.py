"""Operator commands (run, check, usage, launch), usage reporting and materialisation metadata."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
import pytest
from sqlalchemy.engine import Engine

from backfill_assets.cli import build_parser
from backfill_assets.config.settings import Settings
from backfill_assets.config.variables import StoreSettings
from backfill_assets.defs import instance_api
from backfill_assets.defs.partitions import partition_key_for
from backfill_assets.defs.reporting.usage import tenant_usage
from backfill_assets.runner.launch import (
    DagsterClient,
    GraphQLError,
    PartitionState,
    by_tenant,
    select_partitions,
)
from backfill_tests.cli_runs import cli_here, last_json
from backfill_tests.moderation_helpers import busiest, execute, load, one_key

ACME = "acme"


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """SQLite only: these tests drive the CLI against an on-disk Dagster instance (seconds per
    run); the checks, apply and pipeline tests cover both stores."""
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
def env(engine: Engine, store_url: str, tmp_path: Path) -> dict[str, str]:
    load(engine, tmp_path, {ACME: 60, "globex": 20}, spam_every=6)
    return {"BACKFILL_DATABASE_URL": store_url, "DAGSTER_HOME": str(tmp_path / "home")}


def test_run_json_reports_checks_and_apply_per_partition(
    engine: Engine, env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = cli_here(["run", "--tenant", ACME, "--json"], env, capsys)
    doc = last_json(out)
    assert code == 0 and doc["ok"], doc["runs"]
    assert len(doc["partitions"]) == 16
    row = doc["partitions"][0]
    assert row["applied"] is True and row["blocking_failed"] == []
    assert [c["name"] for c in row["checks"]] == [
        "isolation",
        "no_duplicates",
        "coverage",
        "output_schema",
        "billed_within_bound",
        "spend",
        "label_drift",
        "stage_drift",
        "agreement",
    ]
    assert all(c["passed"] for c in row["checks"])
    assert doc["totals"]["accepted"] == 60

    ref = busiest(engine, ACME)
    execute(engine, "UPDATE results SET label = 'nsfw' WHERE key = :k", k=one_key(engine, ref))
    # A plain run skips partitions that were checked and have nothing pending; --force
    # re-runs (and so re-checks) them all.
    code, out = cli_here(["run", "--tenant", ACME, "--json"], env, capsys)
    assert code == 0 and last_json(out)["runs"] == []
    code, out = cli_here(["run", "--tenant", ACME, "--json", "--force"], env, capsys)
    doc = last_json(out)
    assert code == 1 and not doc["ok"]
    assert doc["blocked_partitions"] == [ref.key]
    by_key = {r["partition"]: r for r in doc["partitions"]}
    assert by_key[ref.key]["blocking_failed"] == ["output_schema"]
    assert by_key[ref.key]["applied"] is False
    assert sum(r["applied"] for r in doc["partitions"]) == 15

    code, out = cli_here(["check", "--tenant", ACME], env, capsys)
    assert code == 1
    assert f"FAIL {ref.key} output_schema: 1 row(s) fail the result schema" in out
    # globex was never run: its partitions are incomplete, and only coverage says so.
    code, out = cli_here(["check", "--tenant", "globex", "--slice", "s00", "--json"], env, capsys)
    doc = json.loads(out)
    assert code == 1 and not doc["ok"]
    assert [c["check"] for c in doc["checks"] if not c["passed"]] == ["coverage"]


def test_a_spend_failure_shows_but_neither_blocks_nor_reruns(
    engine: Engine, env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """spend shares the one evaluation with the blocking checks: its failure shows (a failed
    ERROR evaluation) but keeps no label from the posts, and the next run does not redo the
    partition; a blocking failure in the same evaluation still blocks."""
    tight = {**env, "BACKFILL_CHECK_MAX_TOKENS_PER_KEY": "1"}
    code, out = cli_here(["run", "--tenant", ACME, "--json"], tight, capsys)
    doc = last_json(out)
    assert code == 0 and doc["ok"] and doc["blocked_partitions"] == [], doc["runs"]
    rows = doc["partitions"]
    assert len(rows) == 16 and all(r["applied"] for r in rows)
    failing = {r["partition"] for r in rows if any(not c["passed"] for c in r["checks"])}
    assert all(
        [c["name"] for c in r["checks"] if not c["passed"]] == ["spend"]
        for r in rows
        if r["partition"] in failing
    )
    # Every partition that billed a call is over one token per key.
    assert failing == {r["partition"] for r in rows if r["model_calls"]} and len(failing) > 8
    instance = dg.DagsterInstance.from_config(env["DAGSTER_HOME"])
    key = dg.AssetCheckKey(dg.AssetKey("moderation_labels"), "integrity")
    history = instance.event_log_storage.get_asset_check_execution_history(key, limit=100)
    assert {h.partition for h in history if h.status.value == "FAILED"} == failing
    for h in history:
        evaluation = h.event.dagster_event.event_specific_data  # type: ignore[union-attr]
        assert evaluation.blocking is (h.partition not in failing)
        if h.partition in failing:
            assert evaluation.severity == dg.AssetCheckSeverity.ERROR
    # The apply's reading of its run: all of them went through unblocked.
    (run_id,) = {r["run_id"] for r in rows}
    pks = [r["partition"] for r in rows]
    unblocked = instance_api.unblocked_in_run(instance, key.asset_key, ["integrity"], run_id, pks)
    assert set(unblocked) == set(pks)
    states = instance_api.check_states(instance, key, pks)
    assert {pk for pk, s in states.items() if s == "failed, not blocking"} == failing
    # Dagster's public reads (a stock instance) say the same as the accelerator's rows.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(instance_api, "is_ours", lambda _instance: False)
        stock = instance_api.unblocked_in_run(instance, key.asset_key, ["integrity"], run_id, pks)
        assert stock == unblocked
        assert instance_api.check_states(instance, key, pks) == states
    instance.dispose()
    # Done as far as the plan goes: nothing pending, materialised, not blocked, applied; also
    # as the instance tells it, without the store's marks (a store from before them).
    code, out = cli_here(["run", "--tenant", ACME, "--json"], tight, capsys)
    assert code == 0 and last_json(out)["runs"] == []
    execute(engine, "DELETE FROM partition_marks")
    code, out = cli_here(["run", "--tenant", ACME, "--json"], tight, capsys)
    assert code == 0 and last_json(out)["runs"] == []
    code, out = cli_here(["check", "--summary", "--tenant", ACME, "--json"], tight, capsys)
    summary = json.loads(out)
    assert code == 0
    assert summary["counts"]["integrity"]["failed, not blocking"] == len(failing)
    # A blocking member failing in the same evaluation blocks it.
    ref = busiest(engine, ACME)
    execute(
        engine, "UPDATE results SET tenant_id = 'globex' WHERE key = :k", k=one_key(engine, ref)
    )
    code, out = cli_here(["run", "--tenant", ACME, "--json", "--force"], tight, capsys)
    doc = last_json(out)
    assert code == 1 and doc["blocked_partitions"] == [ref.key]
    code, out = cli_here(["check", "--summary", "--tenant", ACME, "--json"], tight, capsys)
    summary = json.loads(out)
    assert code == 1
    assert [r["partition"] for r in summary["partitions"] if r["integrity"] == "failed"] == [
        ref.key
    ]
    code, out = cli_here(["run", "--tenant", ACME, "--json"], tight, capsys)
    assert [r["partition"] for r in last_json(out)["partitions"]] == [ref.key]


def test_usage_and_metadata_after_a_run(
    engine: Engine, env: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cli_here(["run"], env, capsys)[0] == 0
    labels_metadata_names_versions_spend_and_distribution(engine, env)
    code, out = cli_here(["usage", "--csv"], env, capsys)
    rows = list(csv.DictReader(io.StringIO(out)))
    totals_rows = [r for r in rows if r["model"] == "TOTAL"]
    rows = [r for r in rows if r["model"] != "TOTAL"]
    assert [(r["tenant"], r["calls"]) for r in totals_rows] == [(ACME, "60"), ("globex", "20")]
    assert code == 0 and [r["tenant"] for r in rows] == [ACME, "globex"]
    assert {r["model"] for r in rows} == {"fake-moderator-1"} and all(
        len(r["day"]) == 10 for r in rows
    )
    assert [int(r["calls"]) for r in rows] == [60, 20]
    code, out = cli_here(["usage", "--totals", "--json"], env, capsys)
    totals = json.loads(out)["usage"]
    assert [t["tokens"] for t in totals] == [int(r["tokens"]) for r in rows]

    result = dg.materialize(
        [tenant_usage],
        resources={"store": StoreSettings(database_url=env["BACKFILL_DATABASE_URL"])},
        instance=dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster")),
    )
    md = result.asset_materializations_for_node("tenant_usage")[0].metadata
    assert md["tenants"].value == 2 and md["calls"].value == 80
    assert md["tokens"].value == sum(int(r["tokens"]) for r in rows)
    usage_table = str(md["usage"].value)
    assert usage_table.startswith("| tenant | model | day |") and "| globex |" in usage_table


def labels_metadata_names_versions_spend_and_distribution(
    engine: Engine, env: dict[str, str]
) -> None:
    """Each partition's materialisation carries versions, spend, labels and latency."""
    instance = dg.DagsterInstance.from_config(env["DAGSTER_HOME"])
    ref = busiest(engine, ACME)
    record = instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=dg.AssetKey("moderation_labels"), asset_partitions=[ref.key]
        ),
        limit=1,
    ).records[0]
    mat = record.event_log_entry.asset_materialization
    assert mat is not None
    md = {k: v.value for k, v in mat.metadata.items()}
    for name in (
        "task_version",
        "prompt_version",
        "model",
        "billed_tokens_total",
        "latency_p95_ms",
    ):
        assert name in md, name
    assert md["rebilled_tokens_total"] == 0 and md["billed_tokens_total"] > 0
    assert md["label_distribution"].startswith("| label | count | share |")
    assert md["outcome_accepted"] == md["posts"]
    instance.dispose()


def test_partition_selection_for_launch_is_pure() -> None:
    keys = [partition_key_for(t, f"s{i:02d}") for i in range(16) for t in (ACME, "globex")]
    state = PartitionState(
        keys=keys, stale={"s03|acme"}, missing={"s04|globex"}, failed={"s00|acme"}
    )
    assert select_partitions(state, stale=True) == ["s03|acme"]
    assert select_partitions(state, stale=True, missing=True, failed=True) == [
        "s00|acme",
        "s03|acme",
        "s04|globex",
    ]
    assert select_partitions(state, missing=True, failed=True, tenants=[ACME]) == ["s00|acme"]
    assert by_tenant(["s00|acme", "s04|globex", "s03|acme"]) == {
        ACME: ["s00|acme", "s03|acme"],
        "globex": ["s04|globex"],
    }


def test_launch_reports_webserver_errors(capsys: pytest.CaptureFixture[str]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body: dict[str, Any] = json.loads(request.content)
        if "launchPartitionBackfill" in body["query"]:
            doc = {"launchPartitionBackfill": {"__typename": "PythonError", "message": "boom"}}
            return httpx.Response(200, json={"data": doc})
        return httpx.Response(200, json={"errors": [{"message": "Cannot query field"}]})

    client = DagsterClient("http://dagster.test", transport=httpx.MockTransport(handler))
    with pytest.raises(GraphQLError, match="PythonError: boom"):
        client.launch_backfill(["s00|acme"], "t", {"tenant": ACME})
    with pytest.raises(GraphQLError, match="Cannot query field"):
        client.partition_state()
    client.close()
    args = build_parser().parse_args(["launch", "--missing", "--url", "http://127.0.0.1:9"])
    with pytest.raises(ValueError, match="webserver"):
        args.func(args, Settings.from_env({}))


def test_check_summary_shows_passed_failed_and_never_ran(
    engine: Engine, env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_here(["run", "--tenant", ACME], env, capsys)[0] == 0
    code, out = cli_here(["check", "--summary", "--json"], env, capsys)
    doc = json.loads(out)
    by_pk = {r["partition"]: r for r in doc["partitions"]}
    assert code == 0 and len(by_pk) == 32  # both tenants' 16 partitions
    assert all(by_pk[f"s{s:02d}|{ACME}"]["integrity"] == "passed" for s in range(16))
    assert all(by_pk[f"s{s:02d}|globex"]["integrity"] == "never ran" for s in range(16))
    assert doc["counts"]["integrity"] == {
        "passed": 16,
        "failed": 0,
        "failed, not blocking": 0,
        "older": 0,
        "never ran": 16,
    }
    ref = busiest(engine, ACME)
    execute(
        engine, "UPDATE results SET tenant_id = 'globex' WHERE key = :k", k=one_key(engine, ref)
    )
    assert cli_here(["run", "--tenant", ACME, "--force"], env, capsys)[0] == 1
    code, out = cli_here(["check", "--summary", "--tenant", ACME, "--json"], env, capsys)
    doc = json.loads(out)
    assert code == 1
    failed = [r["partition"] for r in doc["partitions"] if r["integrity"] == "failed"]
    assert failed == [ref.key]
