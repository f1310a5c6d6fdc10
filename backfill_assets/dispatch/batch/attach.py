"""A chunk's batch at the provider, exactly once: create it, or find it again.

A create is not idempotent. ``create_sent_at`` is stored before each create and cleared by
every definite answer, so after a lost answer or a crash the next attempt looks the batch up
by its metadata first; and because a provider's list may lag behind its creates, "not found"
is believed only after ``BatchOptions.create_lookup_seconds`` of looking.
"""

from __future__ import annotations

import enum
import time

from backfill_assets.dispatch.batch.context import BatchContext, ChunkJob
from backfill_assets.dispatch.batch.texts import chunk_echoes
from backfill_assets.ledger.run import submissions as store
from backfill_assets.ledger.run.submissions import ChunkState
from backfill_assets.ledger.tables import utcnow
from backfill_assets.providers.batch_client import RateLimited, Refused, TokenLimited, Unsure
from backfill_assets.providers.models.base import RunFatalError

# Lookups of an unsure create back off from the poll interval up to this.
_MAX_LOOKUP_GAP_S = 60.0


class Wait(enum.StrEnum):
    """Why a chunk's batch was not created now."""

    TOKEN_LIMIT = "token_limit"  # the organisation's enqueued-token limit: close the gate
    LATER = "later"  # a 429: ask again at ``job.retry_at``
    LOOKUP = "lookup"  # a create may have made a batch: look for it again at ``job.retry_at``


def metadata(job: ChunkJob) -> dict[str, str]:
    """Batch metadata (at most 16 pairs): the chunk id is how a lost create is found again."""
    sub = job.sub
    return {
        "chunk_id": sub.chunk_id,
        "tenant": sub.tenant_id,
        "partition": job.partition,
        "lines": str(sub.lines),
        "source": "backfill-moderation",
    }


async def reattach(ctx: BatchContext, job: ChunkJob) -> bool:
    """For a chunk whose create may have happened: adopt its batch if the list shows one."""
    sub = job.sub
    found = await ctx.client.find("chunk_id", sub.chunk_id, sub.intent_at)
    if found is None:
        return False
    await ctx.db(
        store.update,
        ctx.fence,
        sub,
        batch_id=found.id,
        state=ChunkState.SUBMITTED,
        provider_status=found.status,
        submitted_at=sub.submitted_at or utcnow(),
    )
    ctx.log(f"chunk {sub.chunk_id}: re-attached to batch {found.id} ({found.status})")
    return True


async def _look_again(ctx: BatchContext, job: ChunkJob) -> Wait | None:
    """A create was sent whose outcome is unknown: find its batch, or wait and look again.

    A provider's list may lag behind its creates, so "not found" right after an unanswered
    create proves nothing. Only after ``create_lookup_seconds`` without finding it is the
    chunk created again (a list lagging longer than that could still give a second batch).
    """
    sub = job.sub
    assert sub.create_sent_at is not None
    if await reattach(ctx, job):
        return None
    waited = (utcnow() - sub.create_sent_at).total_seconds()
    if waited < ctx.options.create_lookup_seconds:
        job.lookups += 1
        gap = min(_MAX_LOOKUP_GAP_S, ctx.options.poll_seconds * 2**job.lookups)
        job.retry_at = time.monotonic() + gap
        return Wait.LOOKUP
    ctx.log(
        f"chunk {sub.chunk_id}: no batch found {waited:.0f}s after an unanswered create; "
        "creating it again"
    )
    return None


async def create(ctx: BatchContext, job: ChunkJob) -> Wait | None:
    """Create the chunk's batch (or adopt the one an unanswered create made); None once it is
    submitted, else why it waits (``job.retry_at`` is set for ``LATER`` and ``LOOKUP``).

    ``create_sent_at`` is stored before each create and cleared by every definite answer, so
    after a lost answer or a crash the next attempt looks the batch up instead of paying twice.
    Run-level refusals (``RunFatalError``) propagate: the run stops, the chunk stays 'uploaded'.
    """
    sub = job.sub
    assert sub.file_id is not None
    if sub.create_sent_at is not None:
        waiting = await _look_again(ctx, job)
        if waiting is None and sub.state == ChunkState.SUBMITTED:
            if sub.run_id == ctx.run_id:
                ctx.stats_for(job.partition).calls += sub.lines
            return None
        if waiting is not None:
            return waiting
    await ctx.db(store.update, ctx.fence, sub, create_sent_at=utcnow())

    async def echoes() -> list[str] | None:
        return await ctx.db(chunk_echoes, ctx, job)  # read only if the create fails

    try:
        batch = await ctx.client.create(sub.file_id, metadata(job), echoes, ctx.endpoint)
    except Unsure as exc:
        # The create may have happened: look it up (after a pause) before creating again.
        ctx.log(f"chunk {sub.chunk_id}: create unsure ({exc}); looking it up before any other")
        job.lookups = 0
        job.retry_at = time.monotonic() + ctx.options.poll_seconds
        return Wait.LOOKUP
    except (RateLimited, Refused, RunFatalError) as exc:
        # A definite answer: no batch was created.
        await ctx.db(store.update, ctx.fence, sub, create_sent_at=None)
        if isinstance(exc, RateLimited):
            job.retry_at = time.monotonic() + (exc.retry_after or ctx.options.poll_seconds)
            return Wait.LATER
        if isinstance(exc, TokenLimited):
            return Wait.TOKEN_LIMIT
        raise
    ctx.reached("create")
    await ctx.db(
        store.update,
        ctx.fence,
        sub,
        batch_id=batch.id,
        state=ChunkState.SUBMITTED,
        provider_status=batch.status,
        submitted_at=utcnow(),
    )
    ctx.stats_for(job.partition).calls += sub.lines
    return None
