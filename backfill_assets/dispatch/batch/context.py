"""What every step of a batch-mode run shares: store, client, budgets, versions, knobs."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy.engine import Engine

from backfill_assets.dispatch.batch_options import BatchOptions
from backfill_assets.dispatch.partition_run import PartitionStats
from backfill_assets.domain.money.budgets import Spend
from backfill_assets.domain.money.prices import PriceTable
from backfill_assets.domain.policy.dialect_sections import OPENAI_MODERATION
from backfill_assets.domain.policy.output_gate import OutputContract
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.domain.work.keys import Versions
from backfill_assets.domain.work.outcomes import RetryPolicy
from backfill_assets.ledger.locks.fence import Fence
from backfill_assets.ledger.policies import contract_lookup, rubric_lookup
from backfill_assets.ledger.run.submissions import LineRow, Submission
from backfill_assets.providers.batch_client import BatchClient
from backfill_assets.providers.batch_wire import ENDPOINT
from backfill_assets.providers.models.base import RunFatalError
from backfill_assets.providers.models.moderation_wire import ENDPOINT as MODERATIONS

T = TypeVar("T")


@dataclass
class ChunkJob:
    """A chunk this run is driving, from intent to booked."""

    sub: Submission
    lines: list[LineRow]
    partition: str
    next_poll: float = 0.0
    interval: float = 0.0
    retry_at: float = 0.0
    last_seen: tuple[str, int, int] | None = None
    # Lookups since an unanswered create (each waits longer).
    lookups: int = 0

    @property
    def state(self) -> str:
        """The submission's state."""
        return self.sub.state


@dataclass
class BatchContext:
    """Shared by the planner, the submitter, the poller and the applier of one run."""

    engine: Engine
    # Every write of the run's partitions (chunk steps, booking) commits through it.
    fence: Fence
    client: BatchClient
    # Whether budgets bind in this run, and the default token cap (None: none). A chunk's
    # reservation is its submission row.
    budgets: bool
    budget_tokens: int | None
    versions: Versions
    rubric: Rubric
    run_id: str
    options: BatchOptions
    retry: RetryPolicy
    prices: PriceTable
    max_tokens_param: str
    # Chat lines ask for their answers' token log-probabilities (the label's probability).
    logprobs: bool
    log: Callable[[str], None]
    # A cascade's later stage: per partition, the posts passed on to it (DispatchJob's).
    passed_on: Mapping[str, Collection[tuple[str, str]]] | None = None
    # A cascade's stages after this one: what they may cost for a post (RunOptions.ahead).
    ahead: Callable[[str], Spend] | None = None
    flush_rows: int = 2048
    flush_interval_s: float = 0.1
    # The API key, only to scrub it from stored messages.
    secret: str = field(default="", repr=False)
    stats: dict[str, PartitionStats] = field(default_factory=dict)
    # Per partition, keys not to send again in this run: retries exhausted, deferred by the
    # budget, or in a batch the provider refused (a retry_exhausted key is pending again for
    # a later run, as in sync mode).
    excluded: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    # Tenants billed past a line's bound: no new chunk for them in this run (as in sync).
    stopped_tenants: dict[str, str] = field(default_factory=dict)
    # A run-level answer inside a batch's results: the run stops once the chunk is booked.
    fatal: RunFatalError | None = None
    _contracts: Callable[[str], OutputContract | None] | None = field(default=None, repr=False)
    _readers: Callable[[str], Rubric | None] | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        """The lines' ``url`` and the batch's endpoint: the dialect's API."""
        return MODERATIONS if self.rubric.dialect == OPENAI_MODERATION else ENDPOINT

    def reader_for(self, key_version: str) -> Rubric | None:
        """How a chunk's answers are read: by the policy (and dialect) it was sent under, so a
        chunk re-attached after the policy changed is judged as sent (None: unknown)."""
        if self._readers is None:
            self._readers = rubric_lookup(self.engine, self.rubric)
        return self._readers(key_version)

    def contract_for(self, key_version: str) -> OutputContract | None:
        """The output contract of a chunk's policy version: a chunk re-attached after the
        policy changed is judged by the policy it was sent under (None: unknown version)."""
        if self._contracts is None:
            self._contracts = contract_lookup(self.engine, self.rubric)
        return self._contracts(key_version)

    def stats_for(self, partition: str) -> PartitionStats:
        """Stats of a partition (created on first use)."""
        st = self.stats.get(partition)
        if st is None:
            st = self.stats[partition] = PartitionStats()
        return st

    def reached(self, point: str) -> None:
        """A crash drill's point (domain/work/faults.py): its hook, if a drill set one, may die
        here."""
        if self.options.at_point is not None:
            self.options.at_point(point)

    async def db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking store code off the event loop."""
        return await asyncio.to_thread(fn, *args, **kwargs)
