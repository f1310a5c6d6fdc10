"""Batch dispatch for ``pipeline.run_partitions``: the counterpart of the sync dispatcher.

Builds what a batch-mode run needs (Files/Batches client, context) on the run's event loop,
drives the partitions' chunks with ``BatchRunner``, and releases everything after. A run-level
refusal becomes ``dispatch.DispatchHalted``, which ``pipeline.run_partitions`` reports as in sync.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from backfill_assets.dispatch.batch.context import BatchContext
from backfill_assets.dispatch.batch.runner import BatchRunner
from backfill_assets.dispatch.partition_run import (
    DispatchHalted,
    DispatchJob,
    PartitionRef,
    PartitionReport,
)
from backfill_assets.dispatch.routing import Routing
from backfill_assets.ledger.spend.budget import may_bind
from backfill_assets.providers.batch_client import BatchClient
from backfill_assets.providers.models.base import RunFatalError


class BatchModeError(RuntimeError):
    """Batch dispatch was asked for without a provider that has a Batch API."""


async def run_batch(
    job: DispatchJob, refs: Sequence[PartitionRef], reports: dict[str, PartitionReport]
) -> None:
    """The partitions' chunks through one Batch API (``job.options.batch.endpoint``)."""
    options, log = job.options, job.log
    opts = options.batch
    if opts is None or opts.endpoint is None:
        raise BatchModeError("BACKFILL_DISPATCH=batch needs BACKFILL_MODEL_BACKEND=openai")
    endpoint = opts.endpoint
    client = BatchClient(
        endpoint,
        transport=opts.transport,
        retry_base_s=min(1.0, opts.poll_seconds),
    )
    ctx = BatchContext(
        engine=job.engine,
        fence=job.fence,
        client=client,
        # Each chunk reserves its lines' bounds in its own row, granted with its intent.
        budgets=may_bind(job.engine, options.budget_tokens),
        budget_tokens=options.budget_tokens or None,
        versions=job.versions,
        rubric=job.rubric,
        run_id=job.run_id,
        options=opts,
        retry=options.retry,
        prices=endpoint.settings.prices(),
        max_tokens_param=endpoint.settings.max_tokens_param,
        logprobs=endpoint.settings.logprobs,
        log=log,
        passed_on=job.passed_on,
        ahead=options.ahead,
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
        raise DispatchHalted(f"run stopped: {exc}") from exc
    finally:
        await client.aclose()


async def batch_lanes(
    job: DispatchJob,
    routing: Routing,
    owned: Sequence[PartitionRef],
    reports: dict[str, PartitionReport],
) -> None:
    """Batch mode, one coordinator per lane with that lane's Batch API, side by side."""
    options = job.options
    mine = {r.key for r in owned}
    lanes = []
    for lane, refs in routing.lanes.items():
        opts = options
        if lane is not None and options.batch is not None:
            endpoint = options.lanes.batch[lane]
            opts = dataclasses.replace(
                options, batch=dataclasses.replace(options.batch, endpoint=endpoint)
            )
        lane_refs = [r for r in refs if r.key in mine]
        lanes.append(run_batch(dataclasses.replace(job, options=opts), lane_refs, reports))
    # One lane's failure must not cut another's batches short: wait for all, then raise.
    for result in await asyncio.gather(*lanes, return_exceptions=True):
        if isinstance(result, BaseException):
            raise result
