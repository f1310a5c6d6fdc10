"""Sharing a plan's boxes out over processes (a CLI ``run`` on several cores).

The heaviest box is cut in two where that halves its work best, until none outweighs half a
fair share; the pieces are dealt out in order and neighbours from the same box joined again.
A process started later gets less by its start-up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from backfill_assets.runner.pooling import Box, Plan

# A partition's work in pending keys' worth: each post its checks and apply read costs about
# half a key (93 + 31 us against ~270 us a key here), and its Dagster events about 400 keys
# (100 one-slice tenants cost ~130 ms a partition more than 3 tenants with the same posts).
POST_WEIGHT = 0.5
PARTITION_WEIGHT = 400
# Cuts per process at most: each cut is one more Dagster run.
_MAX_CUTS_PER_SHARE = 4


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
