"""What a run of partitions is given and gives back: which partitions, with which options
(region lanes included), and what happened to each.

The plain shapes that the sync dispatch (``pipeline.py``), region routing (``routing.py``) and
batch dispatch (``batch/``) share; they live here, below all three, so imports flow one way.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Engine

from backfill_assets.config.variables import RunSettings, default_retry
from backfill_assets.dispatch.batch_options import BatchOptions
from backfill_assets.domain.money.budgets import Spend
from backfill_assets.domain.money.nanos import cached_share, cost_text
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.domain.work.faults import UsageHook
from backfill_assets.domain.work.keys import (
    MAX_LEVEL,
    SLICE_COUNT,
    Versions,
    partition_slices,
    validate_tenant_id,
)
from backfill_assets.domain.work.outcomes import Outcome, RetryPolicy
from backfill_assets.domain.work.regions import unavailable_message
from backfill_assets.ledger.locks.fence import Fence
from backfill_assets.providers.batch_client import BatchEndpoint
from backfill_assets.providers.models.base import ModelAdapter


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One key of one partition. ``text`` is only ever sent to the model."""

    partition: str
    tenant_id: str
    slice: int
    post_id: str
    content_hash: str
    text: str
    key: str
    had_dead_letter: bool = False


@dataclass
class PartitionStats:
    """What happened to a partition's keys in this run."""

    outcomes: Counter[str] = field(default_factory=Counter)
    labels: Counter[str] = field(default_factory=Counter)
    calls: int = 0
    retries: int = 0
    rate_limited: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_nanos: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    # Calls the provider reported no usage for (booked at the bound).
    usage_missing: int = 0
    # Calls billed past their reserved bound (the tenant is stopped), and longest Retry-After.
    over_bound: int = 0
    retry_after_longest_s: float = 0.0
    retry_after_capped: int = 0
    # Answers that the tier had no capacity (flex): retried, never counted as attempts.
    capacity_waits: int = 0
    # Of tokens_in: read from the provider's prompt cache; calls per tier that billed them.
    tokens_cached: int = 0
    service_tiers: Counter[str] = field(default_factory=Counter)
    # Calls of a model with no price (BACKFILL_ALLOW_UNPRICED): cost unknown, not 0.
    calls_cost_unknown: int = 0
    # Results re-read from their stored answers under a changed mapping (no call), and those
    # the new mapping could not read (left as they were).
    relabelled: int = 0
    relabel_unreadable: int = 0
    # A cascade's labels changed or withdrawn by a changed decide rule (no call).
    rerouted: int = 0
    # Accepted labels whose probability the wire gave (p_label), and their sum.
    p_label_known: int = 0
    p_label_sum: float = 0.0

    def note_p_label(self, p_label: float | None, sign: int = 1) -> None:
        """Count an accepted label's probability (``sign`` -1: a row the frame refused)."""
        if p_label is not None:
            self.p_label_known += sign
            self.p_label_sum += sign * p_label


class DispatchHalted(RuntimeError):
    """A run-level error (401, 403, 404, ...) halted sending; keys stay pending.

    ``pipeline.run_partitions`` turns it into ``partition_run.RunStopped`` with the reports."""


# Every outcome's name, in order: iterating the enum costs more than the rest of a summary.
_OUTCOMES = tuple(str(o) for o in Outcome)

# The lane of tenants without a region: the default endpoint.
DEFAULT_LANE: str | None = None


@dataclass(frozen=True)
class Lanes:
    """The regional endpoints this process may send to (the default one is implied).

    ``adapters`` build a region's sync adapter on the run's event loop; ``batch`` holds a
    region's Batch API endpoint. ``any_region`` is for the in-process fake, which sends
    nothing anywhere and so serves every region on the default lane.
    """

    adapters: Mapping[str, Callable[[], ModelAdapter]] = field(default_factory=dict)
    batch: Mapping[str, BatchEndpoint] = field(default_factory=dict)
    any_region: bool = False

    def lane(self, region: str | None, batch: bool = False) -> tuple[bool, str | None]:
        """(routable, lane) of a tenant in ``region``, sync or batch; lane ``None`` is the
        default endpoint."""
        if region is None or self.any_region:
            return True, DEFAULT_LANE
        return region in (self.batch if batch else self.adapters), region


class RunStopped(RuntimeError):
    """A run-level error stopped the run; ``reports`` holds what was done before it."""

    def __init__(self, message: str, reports: list[PartitionReport]) -> None:
        super().__init__(message)
        self.reports = reports


class RegionUnavailable(RunStopped):
    """Partitions whose tenant's region has no endpoint in this process: nothing was sent for
    them (the others were dispatched as usual). ``regions``: region -> partition keys."""

    def __init__(self, regions: dict[str, list[str]], reports: list[PartitionReport]) -> None:
        super().__init__(unavailable_message(regions), reports)
        self.regions = regions


@dataclass(frozen=True, slots=True)
class PartitionRef:
    """A tenant slice partition and its Dagster key string.

    ``slice`` is the partition's number; ``level`` is its tenant's slice level, which decides
    which stored slices of posts it holds (``slices``; see ``keys.partition_slices``).
    """

    key: str
    tenant_id: str
    slice: int
    level: int = MAX_LEVEL

    @property
    def mark(self) -> tuple[str, int, int]:
        """(tenant, partition number, level): how the store's partition marks name it."""
        return (self.tenant_id, self.slice, self.level)

    def __post_init__(self) -> None:
        # Tenant ids name lock files and scope every query: never build one from a bad id.
        validate_tenant_id(self.tenant_id)
        if not 0 <= self.slice < SLICE_COUNT:
            raise ValueError(f"slice {self.slice!r} out of range 0..{SLICE_COUNT - 1}")
        if not 0 <= self.level <= MAX_LEVEL:
            raise ValueError(f"slice level {self.level!r} out of range 0..{MAX_LEVEL}")

    @property
    def slices(self) -> tuple[int, ...]:
        """The stored slices of the posts this partition holds (() if it holds none)."""
        return partition_slices(self.slice, self.level)

    def at_level(self, level: int) -> PartitionRef:
        """The same partition under its tenant's current slice level."""
        return PartitionRef(self.key, self.tenant_id, self.slice, level)


@dataclass(frozen=True)
class RunOptions:
    """Execution knobs of one run: the run's settings group (concurrency, budget, the group
    commit), its retry policy (``RunSettings.retry``), and what a run adds to them."""

    run: RunSettings = field(default_factory=RunSettings)
    retry: RetryPolicy = field(default_factory=default_retry)
    # A crash drill's hooks (domain/work/faults.py); None outside drills.
    after_usage: UsageHook | None = None
    flush_rows: int = 2048
    seed: int | None = None
    # "sync" (one call per key) or "batch" (the provider's Batch API; see batch/).
    dispatch_mode: str = "sync"
    batch: BatchOptions | None = None
    # Regional endpoints (routing.py); without them only tenants with no region are sent.
    lanes: Lanes = field(default_factory=Lanes)
    # A cascade's stages after this one: what they may cost for a post's text, reserved with
    # each call (cascade_run.py).
    ahead: Callable[[str], Spend] | None = None

    @property
    def concurrency(self) -> int:
        """Model calls in flight (``BACKFILL_CONCURRENCY``)."""
        return self.run.concurrency

    @property
    def budget_tokens(self) -> int | None:
        """The strict per-tenant token cap, None when there is none."""
        return self.run.budget_tokens

    @property
    def flush_interval_s(self) -> float:
        """The group commit's longest wait (``BACKFILL_FLUSH_MS``), in seconds."""
        return self.run.flush_interval_s


@dataclass(frozen=True)
class DispatchJob:
    """What every dispatch of one run shares: the store it writes through (under the run's
    writer locks), what it sends, and how."""

    engine: Engine
    fence: Fence
    versions: Versions
    rubric: Rubric
    run_id: str
    options: RunOptions
    log: Callable[[str], None]
    # A cascade's later stage: per partition, the (post, text hash) passed on to it; no other
    # post of the partition is sent (cascade_run.py).
    passed_on: Mapping[str, Collection[tuple[str, str]]] | None = None


@dataclass
class PartitionReport:
    """One partition's result for metadata, CLI output and tests."""

    ref: PartitionRef
    posts: int = 0
    pending: int = 0
    # Keys left to an open batch chunk (not pending in either mode until their batch ends).
    in_open_batch: int = 0
    busy: bool = False
    stats: PartitionStats = field(default_factory=PartitionStats)
    labels_total: dict[str, int] = field(default_factory=dict)
    # Accepted results per rule id (a result naming two rules counts for both).
    rules_total: dict[str, int] = field(default_factory=dict)
    dead_total: dict[str, int] = field(default_factory=dict)
    # A cascade's stages: per stage name, posts sent, calls, cost (nanos) and posts decided.
    stages: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def skipped(self) -> int:
        """Keys already finished before this run."""
        return self.posts - self.pending - self.in_open_batch

    def summary(self) -> dict[str, Any]:
        """Plain JSON summary."""
        st = self.stats
        lat = sorted(st.latencies_ms)
        return {
            "partition": self.ref.key,
            "tenant": self.ref.tenant_id,
            "slice": f"s{self.ref.slice:02d}",
            "busy": self.busy,
            "posts": self.posts,
            "skipped": self.skipped,
            "pending": self.pending,
            "in_open_batch": self.in_open_batch,
            "outcomes": {o: st.outcomes.get(o, 0) for o in _OUTCOMES},
            "calls": st.calls,
            "retries": st.retries,
            "rate_limited": st.rate_limited,
            "tokens_in": st.tokens_in,
            "tokens_out": st.tokens_out,
            "tokens_cached": st.tokens_cached,
            "cached_share": cached_share(st.tokens_cached, st.tokens_in),
            "service_tiers": dict(sorted(st.service_tiers.items())),
            "capacity_waits": st.capacity_waits,
            "cost_usd": cost_text(st.cost_nanos, st.calls_cost_unknown),
            "labels_this_run": dict(sorted((k, v) for k, v in st.labels.items() if v)),
            "labels_total": dict(sorted(self.labels_total.items())),
            "rules_total": dict(sorted(self.rules_total.items())),
            "dead_letters_total": dict(sorted(self.dead_total.items())),
            "relabelled": st.relabelled,
            "relabel_unreadable": st.relabel_unreadable,
            "rerouted": st.rerouted,
            # A list, so the stages keep the cascade's order in any JSON.
            "stages": [{"stage": k, **v} for k, v in self.stages.items()],
            "p_label_known": st.p_label_known,
            "p_label_mean": round(st.p_label_sum / st.p_label_known, 4)
            if st.p_label_known
            else None,
            "latency_p50_ms": round(statistics.median(lat), 2) if lat else None,
            "latency_p95_ms": round(lat[int(0.95 * (len(lat) - 1))], 2) if lat else None,
        }
