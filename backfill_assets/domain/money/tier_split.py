"""What the tiers can do (``Rates``), and how many keys each takes within a window.

The one rule of the batch/flex/standard split: the deadline plan (``deadline.py``) prices it
and the run that carries the plan out uses the same functions, so the plan prices what the
run pays. Robust rather than hopeful: batch only as far as the synchronous tiers could still
rescue a stall, flex only as far as standard could take over should flex stop answering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from backfill_assets.domain.money.prices import Tier


@dataclass(frozen=True, slots=True)
class Rates:
    """What the tiers can do for this run, as measured or configured.

    ``standard_per_s``: keys per second at standard, the run's share of the provider limit.
    ``flex_per_s``: keys per second flex answers when it answers (0: no flex). Flex and
    standard share the limit: a second of it does either tier's keys, not both.
    ``flex_unavailable``: share of flex calls refused for capacity (history or prior), 0..1.
    ``batch_completion_s``: how long a submitted batch is assumed to take (history or prior;
    the pessimistic prior is the whole completion window; infinite: no batch tier here).
    ``batch_cancel_s``: how long a cancelled batch is assumed to stay ``cancelling`` before
    its keys are known (history or the documented bound): the switch-over comes that much
    earlier.
    """

    standard_per_s: float
    flex_per_s: float
    flex_unavailable: float
    batch_completion_s: float
    batch_cancel_s: float

    def __post_init__(self) -> None:
        for name in ("standard_per_s", "flex_per_s", "batch_completion_s", "batch_cancel_s"):
            value = getattr(self, name)
            endless = name == "batch_completion_s" and value == math.inf
            if not ((math.isfinite(value) or endless) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not (0.0 <= self.flex_unavailable <= 1.0):
            raise ValueError(f"flex_unavailable must be within 0..1, got {self.flex_unavailable!r}")

    @property
    def has_batch(self) -> bool:
        return math.isfinite(self.batch_completion_s)

    @property
    def flex_effective_per_s(self) -> float:
        """Keys per second flex actually finishes: a refused call is sent again."""
        return self.flex_per_s * (1.0 - self.flex_unavailable)

    @property
    def sync_per_s(self) -> float:
        """Keys per second the synchronous tiers can always do: standard's (flex only
        makes them cheaper, and slower)."""
        return self.standard_per_s


@dataclass(frozen=True, slots=True)
class SyncSplit:
    """The synchronous keys of a plan: how many go at flex, and until when flex is tried."""

    flex: int
    standard: int
    # Seconds from the start after which every synchronous key still unsent goes at standard
    # (None: nothing goes at flex).
    flex_until_s: float | None


def sync_split(keys: int, rates: Rates, usable_s: float) -> SyncSplit:
    """How many of ``keys`` synchronous keys go at flex within ``usable_s`` seconds: the one
    rule of both the plan and the run that carries it out (``runner/deadline_run.py``).

    Flex is robust, as batch is: the run sends ``flex`` keys at flex and the rest at standard,
    side by side on the one limit, and from ``flex_until_s`` on every key still unsent goes
    at standard, so should flex stop answering the deadline still holds. That needs, with
    ``F`` keys on flex at ``f`` keys/s and standard at ``s`` keys/s: flex done by the
    switch-over when flex answers as assumed (``F/f + (keys-F)/s <= until``) and standard able
    to take the flex keys from there (``until + F/s <= usable_s``). So flex gets the time
    standard does not need: ``F = f * (usable_s - keys/s)``, and ``until = usable_s - F/s``.
    """
    f, s = rates.flex_effective_per_s, rates.standard_per_s
    if keys <= 0 or f <= 0:
        return SyncSplit(0, max(keys, 0), None)
    if s <= 0:
        # Nothing synchronous but flex: it is the only way, rescue or not.
        return SyncSplit(keys, 0, max(0.0, usable_s))
    spare_s = usable_s - keys / s
    flex = min(keys, max(0, math.floor(f * spare_s + 1e-9)))
    if flex == 0:
        return SyncSplit(0, keys, None)
    return SyncSplit(flex, keys - flex, max(0.0, usable_s - flex / s))


@dataclass(frozen=True, slots=True)
class TierSplit:
    """Keys per tier of a plan, and the moments the run acts on (seconds from the start)."""

    keys: dict[Tier, int]
    # When open batches are cancelled and the keys still on batch go synchronous (None:
    # nothing on batch).
    switch_s: float | None
    # From when every synchronous key still unsent goes at standard (None: no flex keys).
    flex_until_s: float | None


def tier_counts(total: int, rates: Rates, usable_s: float) -> TierSplit:
    """How many of ``total`` keys go to each tier within ``usable_s`` seconds, and when the
    switch-over and the end of flex lie.

    Batch first, as far as the synchronous tiers could still rescue it after a stall: with
    ``B`` keys on batch and the rest sent synchronously from the start, a stall found at the
    switch-over is cancelled, which takes ``batch_cancel_s`` (a line may still complete and
    bill while the batch is ``cancelling``, so its keys wait for the end), and then needs
    ``B / sync`` seconds; the switch-over must not come before the batch is expected back.
    The synchronous keys are done by the switch-over (the run sends them first), split
    between flex and standard by ``sync_split``. Counts may exceed what fits when the total
    cannot be done in time at all; the caller reports that as infeasible.
    """
    sync = rates.sync_per_s
    # A stalled batch's keys come back once its cancel has ended.
    room_s = usable_s - rates.batch_cancel_s
    batch = 0
    if room_s >= rates.batch_completion_s:
        if sync <= 0:
            batch = total  # nothing synchronous: batch is the only way, rescue or not
        else:
            # Hedged: the switch-over (room_s - B / sync) comes after the batch is due back.
            hedged = min(total, math.floor(sync * (room_s - rates.batch_completion_s) + 1e-9))
            capacity = math.floor(sync * room_s + 1e-9)
            # More keys than the synchronous tiers can do in time: the excess relies on batch
            # finishing as expected (the plan says so), since nothing else can take it.
            batch = hedged if total <= capacity else total - (capacity - hedged)
    switch_s: float | None = None
    sync_window_s = usable_s
    if batch:
        rescue_s = min(batch, math.floor(sync * room_s)) / sync if sync > 0 else 0.0
        switch_s = max(0.0, room_s - rescue_s)
        sync_window_s = switch_s
    split = sync_split(total - batch, rates, sync_window_s)
    return TierSplit(
        {Tier.BATCH: batch, Tier.FLEX: split.flex, Tier.STANDARD: split.standard},
        switch_s,
        split.flex_until_s,
    )
