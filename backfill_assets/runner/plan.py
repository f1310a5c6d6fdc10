"""Which partitions need a run, and how few Dagster runs can do them.

Cost follows the work, not the bookkeeping:

1. **No work, no run.** One grouped query over the store gives posts and pending keys per
   partition; the store's marks (``partition_marks``: set by the apply, cleared by the next
   materialisation) say which are done at the current code version, and for the rest the
   Dagster instance tells (in a few bulk queries) which partitions are materialised at it,
   checked (``integrity`` did not block the latest materialisation) and applied since. A
   partition with nothing pending that is all three is skipped: no run, no event. So is a
   partition its tenant does not use (it holds no posts).
2. **Pool the rest into boxes** of consecutive keys, each one Dagster run (``pooling.py``).
3. **Share the boxes out** over processes when a CLI ``run`` uses several (``sharing.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import dagster as dg
from sqlalchemy.engine import Engine

from backfill_assets.defs.asset_keys import APPLIED, BLOCKING_CHECK_KEYS, LABELS
from backfill_assets.defs.instance_api import (
    CODE_VERSION_TAG,
    KEYS_PER_READ,
    UNBLOCKED_STATES,
    check_states,
)
from backfill_assets.defs.partitions import (
    partition_keys,
    tenant_partition_keys,
)
from backfill_assets.dispatch.partition_run import PartitionRef
from backfill_assets.domain.work.keys import SLICE_COUNT, Versions, partition_of
from backfill_assets.ledger.engine import read_tx, write_tx
from backfill_assets.ledger.run.partition_marks import mark, marked
from backfill_assets.ledger.run.posts import slice_levels
from backfill_assets.ledger.run.work import pending_counts
from backfill_assets.platform_db.sink import gap_partitions
from backfill_assets.runner.pooling import PartitionPlan, Plan, pool


def make_plan(
    engine: Engine,
    instance: dg.DagsterInstance,
    versions: Versions,
    tenants: Sequence[str] | None = None,
    slices: Iterable[int] | None = None,
    force: bool = False,
    sink_id: str | None = None,
    order: Sequence[str] | None = None,
) -> Plan:
    """Decide which partitions of ``tenants`` (all with posts if None) to run, of slices
    ``slices`` (all if None); with ``sink_id``, a partition not yet written back to that sink
    has work too. ``order``: the instance's partitions, if the caller has just read them."""
    wanted_slices = set(range(SLICE_COUNT) if slices is None else slices)
    with read_tx(engine) as conn:
        counts = pending_counts(conn, tenants, versions)
        names = sorted({t for t, _s in counts} | set(tenants or ()))
        levels = slice_levels(conn, names)
        unsunk = (
            set()
            if sink_id is None
            else gap_partitions(conn, sink_id, versions.key_version, tenants)
        )
        done = set() if force else marked(conn, versions.code_version, tenants)
    if done and not _has_materialisations(instance):
        done = set()  # a fresh instance over an old store: the marks speak of another one
    write_back = {(t, n) for t, n, _level in unsunk}
    folded = _fold(counts, levels)
    active: list[tuple[PartitionRef, int, int]] = []
    for tenant in names:
        level = levels.get(tenant)
        if level is None:
            continue  # posts of a tenant the store does not know: nothing to plan
        mine = folded.get(tenant, {})
        for number, key in enumerate(tenant_partition_keys(tenant, level)):
            if number in wanted_slices:
                n, pending = mine.get(number, [0, 0])
                active.append((PartitionRef(key, tenant, number, level), n, pending))
    idle = [
        ref.key
        for ref, _n, pending in active
        if pending == 0 and not force and ref.mark not in done
    ]
    not_done = _not_done_in_dagster(instance, idle, versions.code_version)
    confirmed = {k for k in idle if k not in not_done}
    learned = [ref.mark for ref, _n, _p in active if ref.key in confirmed]
    if learned:
        # Done as the instance tells: marked, so the next no-op need not ask it again (a
        # store upgraded to marks pays the instance's reads once).
        with write_tx(engine) as conn:
            mark(conn, learned, versions.code_version)
    partitions: list[PartitionPlan] = []
    for ref, n, pending in active:
        if force:
            partitions.append(PartitionPlan(ref, n, pending, True, "--force"))
        elif pending:
            partitions.append(PartitionPlan(ref, n, pending, True, f"{pending} key(s) pending"))
        elif (ref.tenant_id, ref.slice) in write_back:
            partitions.append(PartitionPlan(ref, n, 0, True, "labels not yet written back"))
        elif ref.key in not_done:
            partitions.append(PartitionPlan(ref, n, 0, True, not_done[ref.key]))
        else:
            reason = "nothing pending; materialised at this code version, checked and applied"
            partitions.append(PartitionPlan(ref, n, 0, False, reason))
    if order is None:
        order = partition_keys(instance)
    return Plan(partitions, pool(partitions, order), asked=list(idle))


def _fold(
    counts: Mapping[tuple[str, int], tuple[int, int]], levels: Mapping[str, int]
) -> dict[str, dict[int, list[int]]]:
    """Posts and pending keys per tenant and partition: stored slices folded by each tenant's
    level, in one pass over the counts (not one per tenant: 10,000 tenants)."""
    folded: dict[str, dict[int, list[int]]] = {}
    for (t, stored), (n, pending) in counts.items():
        level = levels.get(t)
        if level is not None:
            got = folded.setdefault(t, {}).setdefault(partition_of(stored, level), [0, 0])
            got[0] += n
            got[1] += pending
    return folded


def _has_materialisations(instance: dg.DagsterInstance) -> bool:
    """Whether the instance has ever materialised the labels (one query)."""
    return instance.get_latest_materialization_event(LABELS) is not None


def _not_done_in_dagster(
    instance: dg.DagsterInstance, keys: Sequence[str], code_version: str
) -> dict[str, str]:
    """Why each of ``keys`` is not done as far as the instance knows ({} if all are)."""
    storage = instance.event_log_storage
    blocking = list(BLOCKING_CHECK_KEYS)
    out: dict[str, str] = {}
    for i in range(0, len(keys), KEYS_PER_READ):
        chunk = list(keys[i : i + KEYS_PER_READ])
        labels_at = storage.get_latest_storage_id_by_partition(
            LABELS, dg.DagsterEventType.ASSET_MATERIALIZATION, set(chunk)
        )
        versions = _code_versions(storage, list(labels_at.values()))
        applied_at = storage.get_latest_storage_id_by_partition(
            APPLIED, dg.DagsterEventType.ASSET_MATERIALIZATION, set(chunk)
        )
        checked: dict[str, bool] = {}
        for check_key in blocking:
            # Failed on spend or drift only counts as checked (the labels were applied), as
            # when those were a check of their own.
            for pk, state in check_states(instance, check_key, chunk).items():
                checked[pk] = checked.get(pk, True) and state in UNBLOCKED_STATES
        for key in chunk:
            if key not in labels_at:
                out[key] = "not materialised"
            elif versions.get(labels_at[key]) != code_version:
                out[key] = "materialised at another code version (stale)"
            elif not checked.get(key, False):
                out[key] = "blocking checks not passed on the latest materialisation"
            elif applied_at.get(key, -1) < labels_at[key]:
                out[key] = "labels not applied since the latest materialisation"
    return out


def _code_versions(storage: Any, storage_ids: list[int]) -> dict[int, str | None]:
    """The code version each materialisation was made with (one query for all of them)."""
    if not storage_ids:
        return {}
    records = storage.get_event_records(
        dg.EventRecordsFilter(
            dg.DagsterEventType.ASSET_MATERIALIZATION, asset_key=LABELS, storage_ids=storage_ids
        ),
        limit=len(storage_ids),
    )
    out: dict[int, str | None] = {}
    for rec in records:
        mat = rec.event_log_entry.asset_materialization
        out[rec.storage_id] = (mat.tags or {}).get(CODE_VERSION_TAG) if mat is not None else None
    return out
