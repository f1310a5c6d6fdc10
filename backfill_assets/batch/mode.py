"""Batch dispatch for ``pipeline.run_partitions``: the counterpart of the sync dispatcher.

Builds what a batch-mode run needs (Files/Batches client, budgets, context) on the run's event
loop, drives the partitions' chunks with ``BatchRunner``, and releases everything after.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sqlalchemy.engine import Engine

from ..keys import Versions
from ..limits import TenantBudgets
from ..models.base import ModelAdapter
from ..prices import PriceTable
from ..rubric import Rubric
from ..store.budget import StoreBudgetLedger
from .client import BatchClient
from .context import BatchContext
from .runner import BatchRunner

if TYPE_CHECKING:
    from ..pipeline import PartitionRef, PartitionReport, RunOptions


class BatchModeError(RuntimeError):
    """Batch dispatch was asked for without a provider that has a Batch API."""


async def run_batch(
    engine: Engine,
    refs: Sequence[PartitionRef],
    reports: dict[str, PartitionReport],
    make_adapter: Callable[[], ModelAdapter],
    versions: Versions,
    rubric: Rubric,
    run_id: str,
    options: RunOptions,
    log: Callable[[str], None],
) -> None:
    """Same signature as the sync dispatch; ``make_adapter`` is not used."""
    opts = options.batch
    if opts is None or opts.endpoint is None:
        raise BatchModeError("BACKFILL_DISPATCH=batch needs BACKFILL_MODEL_BACKEND=openai")
    endpoint = opts.endpoint
    client = BatchClient(
        endpoint, transport=opts.transport, retry_base_s=min(1.0, opts.poll_seconds)
    )
    ledger = StoreBudgetLedger(engine, holder=run_id) if options.budget_tokens else None
    # One reservation per chunk: the whole chunk's estimate, taken before it is submitted.
    budgets = TenantBudgets(options.budget_tokens, ledger, chunk_calls=1)
    ctx = BatchContext(
        engine=engine,
        client=client,
        budgets=budgets,
        versions=versions,
        rubric=rubric,
        run_id=run_id,
        options=opts,
        retry=options.retry,
        prices=PriceTable.from_json(endpoint.prices_json),
        max_tokens_param=endpoint.max_tokens_param,
        log=log,
        flush_rows=options.flush_rows,
        flush_interval_s=options.flush_interval_s,
        secret=endpoint.api_key,
    )
    for ref in refs:
        ctx.stats[ref.key] = reports[ref.key].stats
    try:
        await BatchRunner(ctx, refs, reports).run()
    finally:
        try:
            await budgets.release()
        finally:
            await client.aclose()
