"""Which partitions need a run, and how few Dagster runs can do them.

Cost follows the work, not the bookkeeping:

1. **No work, no run.** One grouped query over the store gives posts and pending keys per
   partition; the store's marks (``partition_marks``: set by the apply, cleared by the next
   materialisation) say which are done at the current code version, and for the rest the
   Dagster instance tells (in a few bulk queries) which partitions are materialised at it,
   checked (``integrity`` passed on the latest materialisation) and applied since. A
   partition with nothing pending that is all three is skipped: no run, no event. So is a
   partition its tenant does not use (it holds no posts).
2. **Pool the rest into boxes.** A Dagster run over a range of the (dynamic) partitions covers
   a stretch of consecutive keys in the instance's order. The keys are walked in that order
   and merged into the current box while the keys that merging adds without work cost less
   than a run of their own (``RUN_COST`` partitions' worth of event writes), up to
   ``MAX_BOX_PARTITIONS``.
3. **Share the boxes out** (``share_out``) when a CLI ``run`` spreads them over processes: the
   heaviest box is cut in two where that halves its work best, until none outweighs half a
   fair share; the pieces are dealt out in order and neighbours from the same box joined
   again. A process started later gets less by its start-up.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
from sqlalchemy.engine import Engine

from backfill_assets.core.keys import SLICE_COUNT, Versions, partition_of
from backfill_assets.dispatch.partition_run import PartitionRef
from backfill_assets.orchestration.asset_keys import APPLIED, BLOCKING_CHECK_KEYS, LABELS
from backfill_assets.orchestration.dagster_private import (
    CODE_VERSION_TAG,
    AssetCheckExecutionRecordStatus,
)
from backfill_assets.orchestration.partitions import (
    partition_keys,
    tenant_of,
    tenant_partition_keys,
)
from backfill_assets.store.engine import read_tx, write_tx
from backfill_assets.store.partition_marks import mark, marked
from backfill_assets.store.posts import slice_levels
from backfill_assets.store.sink import gap_partitions
from backfill_assets.store.work import pending_counts

# One more Dagster run costs about as much as this many partitions' events (run start, steps,
# run end vs. ~6 event writes a partition), measured here; see docs/architecture.md,
# "One run, many partitions".
RUN_COST = 20
# A run's partitions share one event loop and fail or succeed together; keep runs bounded.
MAX_BOX_PARTITIONS = 500
_CHUNK = 900  # partition keys per instance query (SQL parameter limits)
# A partition's work in pending keys' worth: each post its checks and apply read costs about
# half a key (93 + 31 us against ~270 us a key here), and its Dagster events about 400 keys
# (100 one-slice tenants cost ~130 ms a partition more than 3 tenants with the same posts).
POST_WEIGHT = 0.5
PARTITION_WEIGHT = 400
# Cuts per process at most: each cut is one more Dagster run.
_MAX_CUTS_PER_SHARE = 4


@dataclass(frozen=True)
class PartitionPlan:
    """One partition: what is left in it, and whether this invocation runs it and why."""

    ref: PartitionRef
    posts: int
    pending: int
    run: bool
    reason: str


@dataclass(frozen=True)
class Box:
    """A Dagster run's range: ``keys``, consecutive partitions in the instance's order."""

    keys: tuple[str, ...]

    @property
    def start(self) -> str:
        """The range's first partition key."""
        return self.keys[0]

    @property
    def end(self) -> str:
        """The range's last partition key."""
        return self.keys[-1]

    @property
    def tenants(self) -> tuple[str, ...]:
        """The tenants of the range's partitions, in its order, once each."""
        return tuple(dict.fromkeys(tenant_of(k) for k in self.keys))

    @property
    def size(self) -> int:
        """Partitions in the box."""
        return len(self.keys)


@dataclass
class Plan:
    """The partitions considered and the runs that will do the work."""

    partitions: list[PartitionPlan] = field(default_factory=list)
    boxes: list[Box] = field(default_factory=list)

    @property
    def skipped(self) -> list[PartitionPlan]:
        """Partitions no run covers (nothing to do)."""
        covered = {k for b in self.boxes for k in b.keys}
        return [p for p in self.partitions if p.ref.key not in covered]


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
            else gap_partitions(conn, sink_id, versions.prompt_version, tenants)
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
    return Plan(partitions, pool(partitions, order))


def partition_weights(plan: Plan) -> dict[str, float]:
    """Each partition's work in keys' worth (``POST_WEIGHT``, ``PARTITION_WEIGHT``): what the
    run of a box holding it spends on it. Partitions the plan does not run weigh their events
    only (a box may cover them)."""
    return {
        p.ref.key: PARTITION_WEIGHT + (p.pending + POST_WEIGHT * p.posts if p.run else 0)
        for p in plan.partitions
    }


def box_weight(box: Box, weights: Mapping[str, float]) -> float:
    """A box's work: its partitions' weights (a partition unknown to the plan: its events)."""
    return sum(weights.get(k, PARTITION_WEIGHT) for k in box.keys)


def halve(box: Box, weights: Mapping[str, float]) -> tuple[Box, Box] | None:
    """``box`` cut in two where the halves' weights are most even (None for a single
    partition). Both halves are boxes again, together exactly the partitions of ``box``."""
    if box.size < 2:
        return None
    total = box_weight(box, weights)
    best_at, best_gap, left = 1, float("inf"), 0.0
    for i, key in enumerate(box.keys[:-1], start=1):
        left += weights.get(key, PARTITION_WEIGHT)
        gap = abs(total - 2 * left)
        if gap < best_gap:
            best_at, best_gap = i, gap
    return Box(box.keys[:best_at]), Box(box.keys[best_at:])


def share_out(
    boxes: Sequence[Box], weights: Mapping[str, float], processes: int, head_start: float
) -> list[list[Box]]:
    """The boxes spread over at most ``processes`` shares, the first for the calling process
    and the others for processes that start ``head_start`` (keys' worth) later; empty shares
    are dropped. Every partition of ``boxes`` is in exactly one box of one share.

    Boxes are cut (``halve``) until none outweighs half a fair share, then dealt out in order,
    each to the share its middle falls in, and neighbours from the same box are joined again:
    shares come out even to within half a share, in few runs.
    """
    if processes < 2 or not boxes:
        return [list(boxes)] if boxes else []
    total = sum(box_weight(b, weights) for b in boxes)
    fair = (total + head_start * (processes - 1)) / processes
    pieces = [(i, b) for i, b in enumerate(boxes)]  # (the box it came from, the piece)
    for _ in range(_MAX_CUTS_PER_SHARE * processes):
        at = max(range(len(pieces)), key=lambda n: box_weight(pieces[n][1], weights))
        origin, heaviest = pieces[at]
        if box_weight(heaviest, weights) <= fair / 2:
            break
        halves = halve(heaviest, weights)
        if halves is None:
            break
        pieces[at : at + 1] = [(origin, halves[0]), (origin, halves[1])]
    targets = [fair] + [fair - head_start] * (processes - 1)
    shares: list[list[tuple[int, Box]]] = [[]]
    load = 0.0
    for origin, box in pieces:
        w = box_weight(box, weights)
        if shares[-1] and load + w / 2 > targets[len(shares) - 1] and len(shares) < processes:
            shares.append([])
            load = 0.0
        shares[-1].append((origin, box))
        load += w
    return [_joined(share) for share in shares]


def _joined(share: Sequence[tuple[int, Box]]) -> list[Box]:
    """Neighbouring pieces of one box joined back (pieces of a box are consecutive)."""
    out: list[tuple[int, Box]] = []
    for origin, box in share:
        if out and out[-1][0] == origin:
            box = Box(out.pop()[1].keys + box.keys)
        out.append((origin, box))
    return [b for _o, b in out]


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
    for i in range(0, len(keys), _CHUNK):
        chunk = list(keys[i : i + _CHUNK])
        labels_at = storage.get_latest_storage_id_by_partition(
            LABELS, dg.DagsterEventType.ASSET_MATERIALIZATION, set(chunk)
        )
        versions = _code_versions(storage, list(labels_at.values()))
        applied_at = storage.get_latest_storage_id_by_partition(
            APPLIED, dg.DagsterEventType.ASSET_MATERIALIZATION, set(chunk)
        )
        checked: dict[str, bool] = {}
        for info in storage.get_asset_check_partition_info(blocking, partition_keys=chunk):
            if info.partition_key is None:
                continue
            ok = (
                info.latest_execution_status == AssetCheckExecutionRecordStatus.SUCCEEDED
                and info.is_current
            )
            checked[info.partition_key] = checked.get(info.partition_key, True) and ok
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


def pool(
    partitions: Sequence[PartitionPlan],
    key_order: Sequence[str],
    run_cost: int = RUN_COST,
    max_partitions: int = MAX_BOX_PARTITIONS,
) -> list[Box]:
    """The cheapest boxes covering every partition to run (see the module docstring).

    ``key_order`` is the instance's whole partition order: a box is a range of it, so it may
    never cover a partition this plan does not include (``run --tenant``, ``--slice``), whose
    pending work would otherwise be sent too. Such partitions cut the order into segments.
    """
    known = {p.ref.key for p in partitions}
    segments: list[list[str]] = [[]]
    for key in key_order:
        if key in known:
            segments[-1].append(key)
        elif segments[-1]:
            segments.append([])
    listed = set(key_order)
    segments += [[k] for k in sorted(known - listed)]  # not registered: each on its own
    needs = {p.ref.key for p in partitions if p.run}
    boxes: list[Box] = []
    for segment in segments:
        boxes += _pool_segment(segment, needs, run_cost, max_partitions)
    return boxes


def _pool_segment(
    order: Sequence[str], needs: Collection[str], run_cost: int, max_partitions: int
) -> list[Box]:
    """Boxes over one stretch of consecutive keys. A box costs ``run_cost`` plus its
    partitions (with work or not), so the exact split is a dynamic programme over the keys
    with work: ``best[j] = run_cost + pos[j-1] + 1 + min(best[i] - pos[i])`` over the boxes
    ``i..j-1`` that fit, a sliding-window minimum (linear in the keys, for 10,000 tenants)."""
    pos = [i for i, k in enumerate(order) if k in needs]  # positions of keys with work
    best = [0.0] * (len(pos) + 1)
    cut = [0] * (len(pos) + 1)
    window: deque[int] = deque()  # candidate starts i, by rising best[i] - pos[i]
    for j in range(1, len(pos) + 1):
        i = j - 1
        while window and best[window[-1]] - pos[window[-1]] >= best[i] - pos[i]:
            window.pop()
        window.append(i)
        while pos[j - 1] - pos[window[0]] + 1 > max_partitions:
            window.popleft()  # too long a box from there (the newest start always fits)
        start = window[0]
        best[j] = best[start] - pos[start] + pos[j - 1] + 1 + run_cost
        cut[j] = start
    boxes: list[Box] = []
    j = len(pos)
    while j > 0:
        i = cut[j]
        boxes.append(Box(tuple(order[pos[i] : pos[j - 1] + 1])))
        j = i
    return boxes[::-1]


def pool_by_region(
    plan: Plan, key_order: Sequence[str], region_of: Mapping[str, str | None]
) -> Plan:
    """The plan with boxes that never mix regions (region lanes).

    A run's partitions succeed or fail together, so a tenant whose region has no endpoint
    would fail the others pooled with it; and a run tagged with one region is what the run
    queue's per-region limit counts. Each region's partitions are pooled on their own:
    partitions of other regions stay in the order as cuts, so no box spans them.
    """
    tenants = {p.ref.tenant_id for p in plan.partitions}
    boxes: list[Box] = []
    for region in sorted({region_of.get(t) for t in tenants}, key=lambda r: r or ""):
        chosen = [p for p in plan.partitions if region_of.get(p.ref.tenant_id) == region]
        boxes += pool(chosen, key_order)
    at = {k: i for i, k in enumerate(key_order)}
    boxes.sort(key=lambda b: at.get(b.start, len(at)))  # in the instance's order
    return Plan(plan.partitions, boxes)
