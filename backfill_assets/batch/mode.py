"""Batch dispatch for ``pipeline.run_partitions``: the counterpart of the sync dispatcher.

Builds what a batch-mode run needs (Files/Batches client, context) on the run's event loop,
drives the partitions' chunks with ``BatchRunner``, and releases everything after. A run-level
refusal becomes ``dispatch.RunStopped``, which ``pipeline.run_partitions`` reports as in sync.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sqlalchemy.engine import Engine

from ..dispatch import RunStopped
from ..keys import Versions
from ..models.base import ModelAdapter, RunFatalError
from ..prices import PriceTable
from ..rubric import Rubric
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
        endpoint,
        transport=opts.transport,
        retry_base_s=min(1.0, opts.poll_seconds),
        max_retry_after_s=options.retry.max_retry_after_s,
    )
    ctx = BatchContext(
        engine=engine,
        client=client,
        # Each chunk reserves its lines' bounds in its own row, granted with its intent.
        cap=options.budget_tokens or None,
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
    except RunFatalError as exc:
        # As in sync mode: a wrong key, permission, model or URL stops the run; every chunk
        # stays as it is (a batch may still run and bill) and the next run re-attaches.
        log(f"ERROR: {exc}; stopping the run, open chunks stay for the next run")
        raise RunStopped(f"run stopped: {exc}") from exc
    finally:
        await client.aclose()
