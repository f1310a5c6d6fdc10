"""``event_json``: Dagster's serialisation of an event, the same JSON value (Dagster reads it back
to an event it serialises to its own text), and the event log's row of it, Dagster's row, for
events of a real Dagster run and generated metadata of every kind."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import dagster as dg
import pytest
from dagster._core.events import DagsterEventType, StepMaterializationData
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage
from dagster._serdes import deserialize_value, serialize_value
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_assets.accelerators import event_json as module
from backfill_assets.accelerators.event_json import event_json, event_row
from backfill_tests.accelerators.event_entries import check_run, dagster_entry

_TABLE = dg.TableSchema(
    columns=[dg.TableColumn("tenant", "string", constraints=dg.TableColumnConstraints(False))]
)
# One value of each metadata kind a user or Dagster attaches.
METADATA: dict[str, Any] = {
    "int": 5,
    "big": 2**70,
    "float": 0.1,
    "nan": math.nan,
    "inf": -math.inf,
    "text": 'é \u2028 "quoted" </script>',
    "bool": True,
    "none": dg.MetadataValue.null(),
    "md": dg.MetadataValue.md("| a |\n|---|"),
    "json": dg.MetadataValue.json({"b": [1, {"a": None}], "a": 2.5}),
    "url": dg.MetadataValue.url("https://example.com/x?y=1"),
    "path": dg.MetadataValue.path("/tmp/x"),
    "notebook": dg.MetadataValue.notebook("/tmp/x.ipynb"),
    "python": dg.MetadataValue.python_artifact(dg.AssetKey),
    "asset": dg.MetadataValue.asset(dg.AssetKey(["a", "b"])),
    "job": dg.MetadataValue.job("j", "loc"),
    "run": dg.MetadataValue.dagster_run("0" * 36),
    "timestamp": dg.MetadataValue.timestamp(dt.datetime(2026, 1, 2, tzinfo=dt.UTC)),
    "schema": dg.MetadataValue.table_schema(_TABLE),
    "table": dg.MetadataValue.table([dg.TableRecord({"tenant": "t1"})], schema=_TABLE),
    "lineage": dg.TableColumnLineage(
        {"tenant": [dg.TableColumnDep(dg.AssetKey("posts"), "tenant")]}
    ),
}
# A value of a class whose serde this pass does not know: Dagster's serialiser writes it.
CODE_REFS = dg.CodeReferencesMetadataValue(
    code_references=[dg.LocalFileCodeReference(file_path="/x.py", line_number=3)]
)


@dg.asset(partitions_def=dg.StaticPartitionsDefinition(["t1", "t2"]), code_version="v1")
def labels() -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata=METADATA, tags={"k": "v"})


@dg.asset_check(asset=labels)
def integrity() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=False, severity=dg.AssetCheckSeverity.WARN, metadata={"n": 1, "why": "x"}
    )


def assert_dagsters(event: dg.EventLogEntry) -> str:
    """``event_json(event)`` is read by Dagster as the event it serialised: what it reads back
    serialises to Dagster's own text of ``event``. Returns the text."""
    ours = event_json(event)
    theirs = serialize_value(event)
    assert serialize_value(deserialize_value(ours, dg.EventLogEntry)) == theirs
    return ours


@pytest.fixture(scope="module")
def run_events() -> list[dg.EventLogEntry]:
    """Every event of a real run: run and step events, a planned and a stored
    materialisation, a check evaluation, logs."""
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([labels, integrity], instance=instance, partition_key="t1")
    assert result.success
    events = instance.all_logs(result.run_id)
    kinds = {e.dagster_event_type for e in events}
    assert {
        DagsterEventType.ASSET_MATERIALIZATION,
        DagsterEventType.ASSET_MATERIALIZATION_PLANNED,
        DagsterEventType.ASSET_CHECK_EVALUATION,
        DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED,
        DagsterEventType.STEP_SUCCESS,
    } <= kinds
    return events


def test_every_event_of_a_run_is_serialised_as_dagster_does(
    run_events: list[dg.EventLogEntry],
) -> None:
    for event in run_events:
        assert_dagsters(event)


def test_every_row_of_a_run_is_dagsters(run_events: list[dg.EventLogEntry]) -> None:
    storage = dg.DagsterInstance.ephemeral().event_log_storage
    assert isinstance(storage, SqlEventLogStorage)
    for event in run_events:
        ours, theirs = event_row(event), storage._event_to_row(event)
        assert ours.pop("event") == assert_dagsters(event)
        theirs.pop("event")
        assert ours == theirs


def test_materialisations_and_evaluations_take_the_fast_pass(
    run_events: list[dg.EventLogEntry],
) -> None:
    # The events a backfill writes by the thousand never go to Dagster's serialiser; a set
    # (a planned check's partition subset) does.
    for event in run_events:
        if event.dagster_event_type == DagsterEventType.ASSET_CHECK_EVALUATION:
            module._pack(event)
    finite = {k: v for k, v in METADATA.items() if k not in ("nan", "inf")}
    module._pack(
        dagster_entry(
            "run",
            DagsterEventType.ASSET_MATERIALIZATION,
            StepMaterializationData(dg.AssetMaterialization("x", metadata=finite)),
        )
    )
    _run_id, planned, evaluations = check_run(3)
    module._pack(evaluations[0])
    referenced = dagster_entry(
        "run",
        DagsterEventType.ASSET_MATERIALIZATION,
        StepMaterializationData(dg.AssetMaterialization("x", metadata={"refs": CODE_REFS})),
    )
    for event in (planned, referenced):
        with pytest.raises(module._Unpackable):
            module._pack(event)
        assert event_json(event) == serialize_value(event)  # Dagster's serialiser wrote it


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)
_values = st.one_of(
    st.integers(),
    st.floats(),
    st.text(),
    st.booleans(),
    st.builds(dg.MetadataValue.md, st.text()),
    st.builds(dg.MetadataValue.json, st.dictionaries(st.text(), _json, max_size=3)),
    st.builds(dg.MetadataValue.url, st.text()),
    st.builds(dg.MetadataValue.path, st.text()),
)


_tag = st.from_regex(r"[a-z][a-z0-9_.-]{0,20}", fullmatch=True)


@settings(max_examples=150, deadline=None)
@given(
    metadata=st.dictionaries(st.text(), _values, max_size=6),
    tags=st.dictionaries(_tag, _tag, max_size=3),
    partition=st.none() | st.text(min_size=1),
)
def test_any_materialisation_is_serialised_as_dagster_does(
    metadata: dict[str, Any], tags: dict[str, str], partition: str | None
) -> None:
    data = StepMaterializationData(
        dg.AssetMaterialization(
            asset_key=dg.AssetKey(["x", "y"]), metadata=metadata, tags=tags, partition=partition
        )
    )
    event = dagster_entry("run", DagsterEventType.ASSET_MATERIALIZATION, data, "step")
    assert_dagsters(event)


def test_a_failure_of_the_pass_falls_back_to_dagsters_serialiser(
    run_events: list[dg.EventLogEntry], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A shape the pass did not foresee (here: a packer that raises) never loses the event.
    event = next(
        e for e in run_events if e.dagster_event_type == DagsterEventType.ASSET_MATERIALIZATION
    )

    def broken(_value: object) -> object:
        raise ValueError("unforeseen")

    monkeypatch.setitem(module._PACKERS, dg.AssetKey, broken)
    assert event_json(event) == serialize_value(event)


def test_what_orjson_would_misread_goes_dagsters_way(run_events: list[dg.EventLogEntry]) -> None:
    # orjson writes a float that is not finite as null, and refuses an integer past 64 bits:
    # the first takes Dagster's serialiser, the second json.dumps as Dagster's, both its text.
    for value in (math.nan, math.inf, -math.inf, 2**70):
        data = StepMaterializationData(dg.AssetMaterialization("x", metadata={"v": value}))
        event = dagster_entry("run", DagsterEventType.ASSET_MATERIALIZATION, data, "step")
        assert event_json(event) == serialize_value(event)
    small = dagster_entry(
        "run",
        DagsterEventType.ASSET_MATERIALIZATION,
        StepMaterializationData(dg.AssetMaterialization("x", metadata={"v": 0.1, "t": "é"})),
        "step",
    )
    text = assert_dagsters(small)
    assert text != serialize_value(small) and "é" in text  # orjson wrote it: compact UTF-8
