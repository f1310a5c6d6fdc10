"""The deadline plan's switch-over, which cancels the open batches, and the time a cancel
takes: measured when the batch ends, stored for the next deadline plan
(``ledger/run/batch_cancels.py``), and an overrun of the plan's allowance reported.

A batch stays ``cancelling`` until its requests in flight finish (OpenAI: up to 10 minutes),
and a line may still complete and bill meanwhile, so its keys are pending again only once it
has ended: a cancel that takes longer than planned is waited for, never raced.
"""

from __future__ import annotations

import time

from backfill_assets.dispatch.batch.booking import close_unrun
from backfill_assets.dispatch.batch.context import BatchContext, ChunkJob
from backfill_assets.ledger.engine import write_tx
from backfill_assets.ledger.run.batch_cancels import endpoint_id, record_cancel
from backfill_assets.ledger.run.submissions import ChunkState
from backfill_assets.ledger.tables import utcnow
from backfill_assets.providers.batch_client import RateLimited, Refused, Unsure
from backfill_assets.providers.batch_wire import BatchObject


def cancel_seconds(batch: BatchObject, asked: float | None, now: float) -> float | None:
    """How long ``batch``'s cancel took: the provider's own timestamps when it gives them,
    else this process's clock since it asked at ``asked`` (None: not known here)."""
    if (
        batch.status == "cancelled"
        and batch.cancelling_at is not None
        and batch.cancelled_at is not None
    ):
        return float(max(0, batch.cancelled_at - batch.cancelling_at))
    if asked is None:
        return None
    return max(0.0, now - asked)


async def note_ended(
    ctx: BatchContext, job: ChunkJob, batch: BatchObject, asked: float | None
) -> None:
    """Store how long the cancel of an ended batch took, if it was cancelled and that is
    known (a batch that completed before it could be cancelled counts too: its keys were
    known that much after the cancel)."""
    if asked is None and batch.cancelling_at is None:
        return
    seconds = cancel_seconds(batch, asked, time.monotonic())
    endpoint = ctx.options.endpoint
    if seconds is None or endpoint is None:
        return
    await ctx.db(_record, ctx, batch.id, endpoint_id(endpoint.base_url), job.sub.model, seconds)


def _record(ctx: BatchContext, batch_id: str, endpoint: str, model: str, seconds: float) -> None:
    with write_tx(ctx.engine) as conn:
        record_cancel(conn, batch_id, endpoint, model, seconds, utcnow())


def overrun_message(job: ChunkJob, asked: float, allowed_s: float | None, now: float) -> str:
    """The log line when a cancel has taken longer than the plan allows ('' before then)."""
    waited = now - asked
    if allowed_s is None or waited <= allowed_s:
        return ""
    return (
        f"batch {job.sub.batch_id} ({job.partition}): still cancelling after {waited:.0f}s, "
        f"longer than the plan's {allowed_s:.0f}s: waiting for it (a line may still complete "
        "and bill); its keys go at standard once it ends, and the deadline may be missed by "
        "the overrun"
    )


async def switch_over(
    ctx: BatchContext, jobs: dict[str, ChunkJob], cancel_sent: dict[str, float], poll_s: float
) -> None:
    """At the deadline plan's switch-over: chunks not sent yet are closed unrun, and the
    provider is asked to cancel every open batch (``cancel_sent``: when, by chunk). A cancelled
    batch returns (and bills) the lines it completed; they are booked as usual and the rest
    come back pending."""
    sent = False
    for job in list(jobs.values()):
        sub = job.sub
        if sub.chunk_id in cancel_sent:
            continue
        if job.state == ChunkState.INTENT or (
            job.state == ChunkState.UPLOADED and sub.create_sent_at is None
        ):
            await close_unrun(
                ctx, job, "not sent: the deadline plan's switch-over", ChunkState.REQUEUED
            )
            jobs.pop(sub.chunk_id, None)
            continue
        if job.state != ChunkState.SUBMITTED or sub.batch_id is None:
            continue  # a create that may have happened: found (then cancelled) or not
        try:
            batch = await ctx.client.cancel(sub.batch_id)
        except (RateLimited, Unsure) as exc:
            ctx.log(f"batch {sub.batch_id}: cancel not confirmed ({exc}); asking again")
            continue
        except Refused as exc:
            # Typically a batch that ended meanwhile: its next poll says so.
            ctx.log(f"batch {sub.batch_id}: cancel refused ({exc})")
        else:
            ctx.log(f"batch {sub.batch_id} ({job.partition}): cancel asked, {batch.status}")
        cancel_sent[sub.chunk_id] = time.monotonic()
        job.interval = poll_s
        job.next_poll = time.monotonic()
        sent = True
    if sent:
        ctx.reached("cancel")
