"""The product's one door to the Dagster instance's records: Dagster's public API, or an
accelerator when the running instance is ours.

Every instance (stock SQLite, stock PostgreSQL, Dagster+) answers through Dagster's public
names and the event-log interface every storage implements (``instance.event_log_storage``:
partition ids, event records, check partition info). When the instance's event log is one of
ours (``backfill_assets.accelerators``, named in ``dagster.yaml`` and built only on the Dagster
release it was written for), the same answers come from its tables in fewer queries. This is
the only module outside that package that imports it (``pyproject.toml``'s contracts), and only
when the instance is ours: on a stock instance nothing of it is loaded.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg

# The tag a materialisation carries its code version in (Dagster writes it; the UI shows it).
CODE_VERSION_TAG = "dagster/code_version"
# Keys or ids handed to one instance read: its storage binds them as values, and SQLite builds
# before 3.32 take at most 999.
KEYS_PER_READ = 900
# What a partition's latest evaluation of a check says (``check_states``; ``check --summary``).
CHECK_STATES = ("passed", "failed", "failed, not blocking", "older", "never ran")
# The states of a partition whose check does not hold it back.
UNBLOCKED_STATES = frozenset({"passed", "failed, not blocking"})

_ACCELERATORS = "backfill_assets.accelerators."


def is_ours(instance: dg.DagsterInstance) -> bool:
    """Whether the instance's event log is one of the accelerators (so their reads apply)."""
    return type(instance.event_log_storage).__module__.startswith(_ACCELERATORS)


def blocks(evaluation: dg.AssetCheckEvaluation) -> bool:
    """Whether a check evaluation held ``applied_labels`` back: failed at ERROR severity with
    ``blocking`` set (Dagster's gate). One group holds every check, so an evaluation that failed
    only on spend or drift does not block (``check_defs.CheckGroup``); one written before that
    kept its spec's ``blocking`` and does."""
    return (
        not evaluation.passed
        and bool(evaluation.blocking)
        and evaluation.severity == dg.AssetCheckSeverity.ERROR
    )


@dataclass(frozen=True)
class Materialized:
    """What a check needs of a materialisation: where and when, and its integer metadata."""

    storage_id: int
    run_id: str
    timestamp: float
    ints: dict[str, int]


def materializations(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, storage_ids: Sequence[int]
) -> dict[int, Materialized]:
    """The materialisations of ``asset_key`` stored under ``storage_ids``: on our instance their
    rows parsed directly (``accelerators/event_rows.py``), any other read Dagster's way."""
    storage: Any = instance.event_log_storage
    found: dict[int, Materialized] = {}
    if is_ours(instance):
        from backfill_assets.accelerators.event_rows import materializations as rows

        for storage_id, (run_id, ts, ints) in rows(storage, storage_ids).items():
            found[storage_id] = Materialized(storage_id, run_id, ts, ints)
    rest = [i for i in storage_ids if i not in found]
    for i in range(0, len(rest), KEYS_PER_READ):
        chunk = rest[i : i + KEYS_PER_READ]
        records = storage.get_event_records(
            dg.EventRecordsFilter(
                dg.DagsterEventType.ASSET_MATERIALIZATION, asset_key=asset_key, storage_ids=chunk
            ),
            limit=len(chunk),
        )
        for rec in records:
            mat = rec.event_log_entry.asset_materialization
            ints = {
                k: v.value
                for k, v in (mat.metadata if mat else {}).items()
                if isinstance(v, dg.IntMetadataValue) and isinstance(v.value, int)
            }
            found[rec.storage_id] = Materialized(rec.storage_id, rec.run_id, rec.timestamp, ints)
    return found


@functools.cache
def _target_class() -> Any:
    # Dagster 1.13 exports no name for a check evaluation's target materialisation; its stored
    # form is public (``deserialize_value``) and kept readable across releases, so the class
    # comes from there rather than from a private module.
    return type(
        dg.deserialize_value(
            '{"__class__": "AssetCheckEvaluationTargetMaterializationData",'
            ' "run_id": "", "storage_id": 0, "timestamp": 0.0}'
        )
    )


def target_materialization(found: Materialized) -> Any:
    """A check evaluation's pointer to the checked materialisation
    (``AssetCheckEvaluation(target_materialization_data=...)``), which ``AssetCheckResult``
    fills in for a single-partition step; our checks report many partitions a step."""
    return _target_class()(
        storage_id=found.storage_id, run_id=found.run_id, timestamp=found.timestamp
    )


def check_states(
    instance: dg.DagsterInstance, check_key: dg.AssetCheckKey, partition_keys: Sequence[str]
) -> dict[str, str]:
    """Each of ``partition_keys`` that has a row for ``check_key``: its latest evaluation as
    one of ``CHECK_STATES``. ``older``: of an earlier materialisation; ``never ran``: planned
    or skipped, not evaluated; ``failed, not blocking``: failed on spend or drift alone (the
    labels were applied). Partitions without a row are left out. Dagster's partition info a
    chunk of keys, and the bodies of the current failures only."""
    storage: Any = instance.event_log_storage
    out: dict[str, str] = {}
    failed: list[Any] = []
    for i in range(0, len(partition_keys), KEYS_PER_READ):
        chunk = list(partition_keys[i : i + KEYS_PER_READ])
        for info in storage.get_asset_check_partition_info([check_key], partition_keys=chunk):
            if info.partition_key is None:
                continue
            status = info.latest_execution_status.value
            state = {"SUCCEEDED": "passed", "FAILED": "failed"}.get(status, "never ran")
            if state != "never ran" and not info.is_current:
                state = "older"
            elif state == "failed":
                failed.append(info)
            out[info.partition_key] = state
    if not failed:
        return out
    if is_ours(instance):
        from backfill_assets.accelerators.check_executions import unblocking_failures

        latest = [(info.latest_planned_run_id, info.partition_key) for info in failed]
        passing = unblocking_failures(storage, check_key, latest, blocks)
    else:
        passing = {pk for _name, pk in _not_blocking(instance, failed)}
    for pk in passing:
        out[pk] = "failed, not blocking"
    return out


def _not_blocking(instance: dg.DagsterInstance, infos: Sequence[Any]) -> set[tuple[str, str]]:
    """Of partition infos whose latest evaluation failed, the (check, partition) pairs whose
    evaluation did not block: the latest evaluation of each in its run's events, a run a read
    (the index holds no check evaluation events to read by id)."""
    wanted: dict[str, set[tuple[str, str]]] = {}
    for info in infos:
        pair = (info.check_key.name, info.partition_key)
        wanted.setdefault(info.latest_planned_run_id, set()).add(pair)
    asset_keys = {info.check_key.asset_key for info in infos}
    out: set[tuple[str, str]] = set()
    for run_id, pairs in wanted.items():
        latest: dict[tuple[str, str], dg.AssetCheckEvaluation] = {}
        found = instance.event_log_storage.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
        )
        for rec in found.records:  # in the order they were stored: the last one wins
            evaluation = rec.event_log_entry.get_dagster_event().event_specific_data
            if not isinstance(evaluation, dg.AssetCheckEvaluation):
                continue
            pair = (evaluation.check_name, evaluation.partition or "")
            if evaluation.asset_key in asset_keys and pair in pairs:
                latest[pair] = evaluation
        out |= {pair for pair, evaluation in latest.items() if not blocks(evaluation)}
    return out


def unblocked_in_run(
    instance: dg.DagsterInstance,
    asset_key: dg.AssetKey,
    check_names: Sequence[str],
    run_id: str,
    partition_keys: Sequence[str],
) -> dict[str, set[str]]:
    """Each of ``partition_keys``' checks of ``check_names`` whose evaluation in ``run_id`` did
    not block: passed, or failed on non-blocking members only."""
    if is_ours(instance):
        from backfill_assets.accelerators.check_executions import unblocked_in_run as rows

        storage: Any = instance.event_log_storage
        return rows(storage, asset_key, check_names, run_id, blocks)
    keys = [dg.AssetCheckKey(asset_key, name) for name in check_names]
    out: dict[str, set[str]] = {}
    failed: list[Any] = []
    for i in range(0, len(partition_keys), KEYS_PER_READ):
        chunk = list(partition_keys[i : i + KEYS_PER_READ])
        for info in instance.event_log_storage.get_asset_check_partition_info(
            keys, partition_keys=chunk
        ):
            if info.partition_key is None or info.latest_planned_run_id != run_id:
                continue
            status = info.latest_execution_status.value
            if status == "SUCCEEDED":
                out.setdefault(info.partition_key, set()).add(info.check_key.name)
            elif status == "FAILED":
                failed.append(info)
    for check_name, pk in _not_blocking(instance, failed):
        out.setdefault(pk, set()).add(check_name)
    return out


def add_partition_metadata(
    context: dg.AssetExecutionContext,
    by_partition: Mapping[str, Mapping[str, Any]],
    run_keys: Collection[str] | None = None,
) -> None:
    """Attach each partition's metadata to its materialisation in a (range) run.

    ``context.add_asset_metadata(partition_key=...)`` lists the run's whole range again on
    every call (three instance queries each over the dynamic tenant dimension). The keys are
    checked once against the run's partition keys instead; on our instance they go to the
    step's accumulator in one step (``accelerators/step_metadata.py``), on any other through
    the public method.

    ``run_keys``: the run's partition keys, when the step has read them already (each read of
    ``context.partition_keys`` lists every dynamic partition of the instance again).
    """
    known = set(context.partition_keys if run_keys is None else run_keys)
    unknown = sorted(set(by_partition) - known)
    if unknown:
        raise dg.DagsterInvariantViolationError(
            f"metadata for partition(s) this run does not target: {', '.join(unknown[:5])}"
        )
    if is_ours(context.instance):
        from backfill_assets.accelerators.step_metadata import add_in_one_step

        if add_in_one_step(context, by_partition):
            return
    for pk, metadata in by_partition.items():
        context.add_asset_metadata(metadata, partition_key=pk)


def close_event_logs() -> None:
    """Close this process's pooled event-log connections, if our embedded instance opened any
    (a run helper before it leaves: its exit hooks are the parent's)."""
    pooled = sys.modules.get("backfill_assets.accelerators.sqlite_event_log")
    if pooled is not None:
        pooled.close_event_logs()
