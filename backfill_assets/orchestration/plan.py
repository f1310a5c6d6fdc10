"""Which partitions need a run, and how few Dagster runs can do them.

Cost follows the work, not the bookkeeping:

1. **No work, no run.** One grouped query over the store gives posts and pending keys per
   partition; the store's marks (``partition_marks``: set by the apply, cleared by the next
   materialisation) say which are done at the current code version, and for the rest the
   Dagster instance tells (in a few bulk queries) which partitions are materialised at it,
   checked (``integrity`` passed on the latest materialisation) and applied since. A
   partition with nothing pending that is all three is skipped: no run, no event. So is a
   partition its tenant does not use (it holds no posts).
2. **Pool the rest into boxes.** A Dagster run over a range of a multi-partitioned asset covers
   a 2D box: consecutive tenants (in the instance's order) x a contiguous slice range. Tenants
   are walked in that order and merged into the current box while the partitions that merging
   adds without work cost less than a run of their own (``RUN_COST`` partitions' worth of
   event writes), up to ``MAX_BOX_PARTITIONS``.
3. **Share the boxes out** (``share_out``) when a CLI ``run`` spreads them over processes: the
   heaviest box is cut in two (between tenants or between slices, whichever halves its work
   better) until none outweighs half a fair share; the pieces are dealt out in order and
   neighbours from the same box joined again. A process started later gets less by its
   start-up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
from sqlalchemy.engine import Engine

from backfill_assets.audit.check_rules import CHECK_GROUPS
from backfill_assets.core.keys import SLICE_COUNT, Versions, partition_of, slice_key
from backfill_assets.dispatch.partition_run import PartitionRef
from backfill_assets.orchestration.dagster_private import (
    CODE_VERSION_TAG,
    AssetCheckExecutionRecordStatus,
)
from backfill_assets.orchestration.partitions import (
    partition_key_for,
    tenant_partition_keys,
    tenant_partitions,
)
from backfill_assets.store.engine import read_tx, write_tx
from backfill_assets.store.partition_marks import mark, marked
from backfill_assets.store.posts import slice_levels
from backfill_assets.store.sink import gap_partitions
from backfill_assets.store.work import pending_counts

LABELS = dg.AssetKey("moderation_labels")
APPLIED = dg.AssetKey("applied_labels")
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
    """A Dagster run's range: ``tenants`` (consecutive in the instance's order) x slices."""

    tenants: tuple[str, ...]
    first: int
    last: int

    @property
    def start(self) -> str:
        """The range's first partition key."""
        return partition_key_for(self.tenants[0], slice_key(self.first))

    @property
    def end(self) -> str:
        """The range's last partition key."""
        return partition_key_for(self.tenants[-1], slice_key(self.last))

    @property
    def keys(self) -> list[str]:
        """Every partition key the run covers."""
        return [
            partition_key_for(t, slice_key(s))
            for t in self.tenants
            for s in range(self.first, self.last + 1)
        ]

    @property
    def size(self) -> int:
        """Partitions in the box."""
        return len(self.tenants) * (self.last - self.first + 1)


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
    """Decide which partitions of ``tenants`` (all with posts if None) x ``slices`` to run;
    with ``sink_id``, a partition not yet written back to that sink has work too. ``order``:
    the instance's tenant partitions, if the caller has just read them."""
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
    partitions: list[PartitionPlan] = []
    active: list[tuple[PartitionRef, int, int]] = []
    for tenant in names:
        level = levels.get(tenant)
        if level is None:
            continue  # posts of a tenant the store does not know: nothing to plan
        keys = tenant_partition_keys(tenant)
        mine = folded.get(tenant, {})
        for number in sorted(wanted_slices):
            ref = PartitionRef(keys[number], tenant, number, level)
            if not ref.slices:
                reason = f"holds no posts (the tenant uses {1 << level} of its partitions)"
                partitions.append(PartitionPlan(ref, 0, 0, False, reason))
                continue
            n, pending = mine.get(number, [0, 0])
            active.append((ref, n, pending))
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
        order = list(instance.get_dynamic_partitions(tenant_partitions.name or "tenants"))
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
    """``box`` cut in two, between tenants or between slices, with the most even weights
    (None for a single partition). Both halves are boxes again: consecutive tenants x a
    contiguous slice range, together exactly the partitions of ``box``."""
    cuts: list[tuple[Box, Box]] = []
    for i in range(1, len(box.tenants)):
        cuts.append(
            (Box(box.tenants[:i], box.first, box.last), Box(box.tenants[i:], box.first, box.last))
        )
    for s in range(box.first + 1, box.last + 1):
        cuts.append((Box(box.tenants, box.first, s - 1), Box(box.tenants, s, box.last)))
    if not cuts:
        return None
    return min(cuts, key=lambda ab: abs(box_weight(ab[0], weights) - box_weight(ab[1], weights)))


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
    return [_joined(share, boxes) for share in shares]


def _joined(share: Sequence[tuple[int, Box]], boxes: Sequence[Box]) -> list[Box]:
    """Neighbouring pieces of one box joined back where their union is a box."""
    out: list[tuple[int, Box]] = []
    for origin, box in share:
        while out and out[-1][0] == origin:
            prev = out[-1][1]
            joined = _join(prev, box, boxes[origin].tenants)
            if joined is None:
                break
            out.pop()
            box = joined
        out.append((origin, box))
    return [b for _o, b in out]


def _join(a: Box, b: Box, order: Sequence[str]) -> Box | None:
    if a.tenants == b.tenants and a.last + 1 == b.first:
        return Box(a.tenants, a.first, b.last)
    if (a.first, a.last) == (b.first, b.last) and (
        order.index(a.tenants[-1]) + 1 == order.index(b.tenants[0])
    ):
        return Box(a.tenants + b.tenants, a.first, a.last)
    return None


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
    blocking = [dg.AssetCheckKey(LABELS, g.name) for g in CHECK_GROUPS if g.blocking]
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
    tenant_order: Sequence[str],
    run_cost: int = RUN_COST,
    max_partitions: int = MAX_BOX_PARTITIONS,
) -> list[Box]:
    """The cheapest boxes covering every partition to run (see the module docstring).

    ``tenant_order`` is the instance's whole tenant order: a box is a range of it, so it may
    never cover a tenant this plan does not include (``run --tenant``), whose pending work
    would otherwise be sent too. Such tenants cut the order into segments.
    """
    known = _known(partitions)
    segments: list[list[str]] = [[]]
    for tenant in tenant_order:
        if tenant in known:
            segments[-1].append(tenant)
        elif segments[-1]:
            segments.append([])
    listed = set(tenant_order)
    segments += [[t] for t in sorted(known - listed)]  # not registered: each on its own
    needs: dict[str, set[int]] = {}
    for p in partitions:
        if p.run:
            needs.setdefault(p.ref.tenant_id, set()).add(p.ref.slice)
    boxes: list[Box] = []
    for segment in segments:
        boxes += _pool_segment(segment, needs, run_cost, max_partitions)
    return boxes


def _pool_segment(
    order: Sequence[str], needs: Mapping[str, set[int]], run_cost: int, max_partitions: int
) -> list[Box]:
    """Boxes over one stretch of consecutive tenants: a box's cost is ``run_cost`` plus its
    partitions (with work or not), so an exact split is a 1D dynamic programme over the
    tenants with work."""
    pos = [i for i, t in enumerate(order) if t in needs]  # positions of tenants with work
    ranges = [(min(needs[order[i]]), max(needs[order[i]])) for i in pos]
    best = [0.0] + [float("inf")] * len(pos)
    cut = [0] * (len(pos) + 1)
    for j in range(1, len(pos) + 1):
        lo, hi = ranges[j - 1]
        for i in range(j - 1, -1, -1):
            lo, hi = min(lo, ranges[i][0]), max(hi, ranges[i][1])
            size = (pos[j - 1] - pos[i] + 1) * (hi - lo + 1)
            if size > max_partitions and i < j - 1:
                break  # wider or longer segments only grow
            cost = best[i] + run_cost + size
            if cost < best[j]:
                best[j], cut[j] = cost, i
    boxes: list[Box] = []
    j = len(pos)
    while j > 0:
        i = cut[j]
        lo = min(r[0] for r in ranges[i:j])
        hi = max(r[1] for r in ranges[i:j])
        boxes.append(Box(tuple(order[pos[i] : pos[j - 1] + 1]), lo, hi))
        j = i
    return boxes[::-1]


def _known(partitions: Sequence[PartitionPlan]) -> set[str]:
    return {p.ref.tenant_id for p in partitions}


def pool_by_region(
    plan: Plan, tenant_order: Sequence[str], region_of: Mapping[str, str | None]
) -> Plan:
    """The plan with boxes that never mix regions (region lanes).

    A run's partitions succeed or fail together, so a tenant whose region has no endpoint
    would fail the others pooled with it; and a run tagged with one region is what the run
    queue's per-region limit counts. The tenant order is cut where the region changes and
    each stretch is pooled on its own (a box is consecutive tenants, so none crosses a cut).
    """
    known = _known(plan.partitions)
    boxes: list[Box] = []
    for region in sorted({region_of.get(t) for t in known}, key=lambda r: r or ""):
        members = {t for t in known if region_of.get(t) == region}
        # Tenants of other regions stay in the order as cuts: pool() never spans them.
        chosen = [p for p in plan.partitions if p.ref.tenant_id in members]
        boxes += pool(chosen, tenant_order)
    at = {t: i for i, t in enumerate(tenant_order)}
    boxes.sort(key=lambda b: at.get(b.tenants[0], len(at)))  # in the tenant order
    return Plan(plan.partitions, boxes)
