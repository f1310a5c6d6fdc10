"""How few Dagster runs can do a plan's partitions: boxes of consecutive keys.

A Dagster run over a range of the (dynamic) partitions covers a stretch of consecutive keys in
the instance's order. The keys are walked in that order and merged into the current box while
the keys that merging adds without work cost less than a run of their own (``RUN_COST``
partitions' worth of event writes), up to ``MAX_BOX_PARTITIONS``. ``plan.py`` decides which
partitions need a run; ``sharing.py`` spreads the boxes over processes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from backfill_assets.defs.partitions import tenant_of
from backfill_assets.dispatch.partition_run import PartitionRef

# One more Dagster run costs about as much as this many partitions' events (run start, steps,
# run end vs. ~6 event writes a partition), measured here; see docs/architecture.md,
# "One run, many partitions".
RUN_COST = 20
# A run's partitions share one event loop and fail or succeed together; keep runs bounded.
MAX_BOX_PARTITIONS = 500


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
    # Partitions with nothing pending whose state the instance was asked for: the store's
    # marks did not settle them (a no-op with every partition marked asks about none).
    asked: list[str] = field(default_factory=list)

    @property
    def skipped(self) -> list[PartitionPlan]:
        """Partitions no run covers (nothing to do)."""
        covered = {k for b in self.boxes for k in b.keys}
        return [p for p in self.partitions if p.ref.key not in covered]


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
    return replace(plan, boxes=boxes)
