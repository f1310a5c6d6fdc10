"""From pending keys to a batch at the provider: plan, reserve, intent, upload, create.

Every step is recorded before the next one starts, and each provider id is stored the moment
it is returned; a chunk whose process died in between is re-attached (``find``), never
created twice.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Sequence

from ..keys import work_key
from ..limits import Reservation
from ..models.base import ModelRequest
from ..rubric import MAX_OUTPUT_TOKENS, estimate_prompt_tokens
from ..store import submissions as store
from ..store.tables import utcnow
from ..store.work import PendingPost
from .chunks import ChunkLine, chunk_base, chunk_id, split
from .client import RateLimited, Refused, Unsure, retry
from .context import BatchContext, ChunkJob
from .rows import LineRows
from .wire import input_line

TOKEN_LIMIT = "token_limit_exceeded"


class LookupFailed(RuntimeError):
    """A create whose outcome is unknown could not be looked up: the run must stop."""


def _line_bytes(ctx: BatchContext, tenant_id: str, line: ChunkLine) -> bytes:
    request = ModelRequest(
        key=line.key,
        tenant_id=tenant_id,
        post_id=line.post_id,
        attempt=line.attempt_no,
        model=ctx.versions.model,
        messages=ctx.rubric.messages(line.key, line.text),
        max_output_tokens=MAX_OUTPUT_TOKENS,
        estimated_tokens=0,
    )
    return input_line(request, ctx.max_tokens_param)


def _estimate(ctx: BatchContext, lines: Sequence[ChunkLine]) -> int:
    return sum(estimate_prompt_tokens(ctx.rubric, ln.text) + MAX_OUTPUT_TOKENS for ln in lines)


async def _reserve(
    ctx: BatchContext, tenant_id: str, lines: list[ChunkLine]
) -> tuple[list[ChunkLine], Reservation | None]:
    """Reserve the whole chunk; if the budget is short, the longest prefix that fits."""
    n = len(lines)
    while n:
        reservation = await ctx.budgets.reserve(tenant_id, _estimate(ctx, lines[:n]))
        if reservation is not None:
            return lines[:n], reservation
        n //= 2
    return [], None


async def plan(
    ctx: BatchContext,
    partition: str,
    tenant_id: str,
    slice_no: int,
    pending: Sequence[PendingPost],
    max_lines: int,
) -> tuple[list[ChunkJob], list[str]]:
    """Chunks (intent recorded) for ``pending``, and the keys deferred by the budget."""
    prior = await ctx.db(_prior, ctx, tenant_id, slice_no)
    lines: list[ChunkLine] = []
    for p in pending:
        key = work_key(ctx.versions, tenant_id, p.post_id, p.content_hash)
        lines.append(ChunkLine(key, p.post_id, p.content_hash, p.text, prior.get(key, 0) + 1))
    # Sorted by key: the same pending keys always give the same chunks and file bytes.
    lines.sort(key=lambda ln: ln.key)
    encoded = [_line_bytes(ctx, tenant_id, ln) for ln in lines]
    jobs: list[ChunkJob] = []
    for span in split([len(b) for b in encoded], max_lines, ctx.options.max_file_bytes):
        chosen, reservation = await _reserve(ctx, tenant_id, lines[span.start : span.stop])
        if reservation is None or not chosen:
            break
        content = b"".join(encoded[span.start : span.start + len(chosen)])
        jobs.append(
            await _intent(ctx, partition, tenant_id, slice_no, chosen, content, reservation)
        )
        if len(chosen) < len(span):
            break  # the budget ran out inside this chunk: the rest waits for a later run
    planned = {ln.key for job in jobs for ln in job.lines}
    return jobs, [ln.key for ln in lines if ln.key not in planned]


def _prior(ctx: BatchContext, tenant_id: str, slice_no: int) -> dict[str, int]:
    with ctx.engine.connect() as conn:
        return store.prior_sends(conn, tenant_id, slice_no)


def _next_seq(ctx: BatchContext, base: str) -> int:
    with ctx.engine.connect() as conn:
        return store.next_seq(conn, base)


async def _intent(
    ctx: BatchContext,
    partition: str,
    tenant_id: str,
    slice_no: int,
    lines: list[ChunkLine],
    content: bytes,
    reservation: Reservation,
) -> ChunkJob:
    base = chunk_base(ctx.versions, tenant_id, slice_no, [ln.key for ln in lines])
    seq = await ctx.db(_next_seq, ctx, base)
    v = ctx.versions
    sub = store.Submission(
        chunk_id=chunk_id(base, seq),
        chunk_base=base,
        seq=seq,
        tenant_id=tenant_id,
        slice=slice_no,
        model=v.model,
        prompt_version=v.prompt_version,
        task_version=v.task_version,
        lines=len(lines),
        file_sha256=hashlib.sha256(content).hexdigest(),
        file_bytes=len(content),
        run_id=ctx.run_id,
        intent_at=utcnow(),
        reserved_tokens=reservation.tokens,
    )
    rows = [
        store.LineRow(n, ln.key, ln.post_id, ln.content_hash, ln.attempt_no)
        for n, ln in enumerate(lines, start=1)
    ]
    builder = LineRows(v, ctx.run_id, tenant_id, slice_no, partition, sub.chunk_id)
    await ctx.db(store.record_intent, ctx.engine, sub, rows, [builder.attempt(r) for r in rows])
    ctx.kill("intent")
    # The file is not kept: ``upload`` rebuilds it from the posts, so memory holds one file at
    # a time however many chunks a run plans, and a resumed chunk takes the same path.
    return ChunkJob(sub, rows, partition, reservation)


def rebuild(ctx: BatchContext, job: ChunkJob) -> bytes | None:
    """The chunk's file, rebuilt from its lines and the posts; must match the intent's hash.

    None if a post changed since the intent (after a crash, say): the chunk is abandoned.
    """
    sub = job.sub
    with ctx.engine.connect() as conn:
        texts = store.post_texts(conn, sub.tenant_id, [ln.post_id for ln in job.lines])
    parts: list[bytes] = []
    for ln in job.lines:
        found = texts.get(ln.post_id)
        if found is None or found[0] != ln.content_hash:
            return None
        chunk_line = ChunkLine(ln.key, ln.post_id, ln.content_hash, found[1], ln.attempt_no)
        parts.append(_line_bytes(ctx, sub.tenant_id, chunk_line))
    content = b"".join(parts)
    return content if hashlib.sha256(content).hexdigest() == sub.file_sha256 else None


async def upload(ctx: BatchContext, job: ChunkJob) -> None:
    """Upload the chunk's file and store its id at once."""
    content = await ctx.db(rebuild, ctx, job)
    if content is None:
        raise Refused("the chunk's posts changed before its file was uploaded", code="stale")
    file_id = await retry(
        functools.partial(ctx.client.upload, f"{job.sub.chunk_id}.jsonl", content),
        what=f"upload {job.sub.chunk_id}",
        base_s=ctx.client.retry_base_s,
        log=ctx.log,
    )
    ctx.kill("upload")
    await ctx.db(store.update, ctx.engine, job.sub, file_id=file_id, state="uploaded")


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
    """For a chunk uploaded by a process that died: adopt its batch if one was created."""
    sub = job.sub
    found = await ctx.client.find("chunk_id", sub.chunk_id, sub.intent_at)
    if found is None:
        return False
    await ctx.db(
        store.update,
        ctx.engine,
        sub,
        batch_id=found.id,
        state="submitted",
        provider_status=found.status,
        submitted_at=sub.submitted_at or utcnow(),
    )
    ctx.log(f"chunk {sub.chunk_id}: re-attached to batch {found.id} ({found.status})")
    return True


async def create(ctx: BatchContext, job: ChunkJob) -> str | None:
    """Create the chunk's batch; returns None on success, else why it must wait.

    ``"token_limit"`` (the organisation's enqueued-token limit; wait for earlier batches) or
    ``"later"`` (429 or an unsure failure with no batch found; ``job.retry_at`` is set).
    """
    sub = job.sub
    assert sub.file_id is not None
    try:
        batch = await ctx.client.create(sub.file_id, metadata(job))
    except RateLimited as exc:
        job.retry_at = time.monotonic() + (exc.retry_after or ctx.options.poll_seconds)
        return "later"
    except Unsure as exc:
        # The create may have happened: look before creating again.
        ctx.log(f"chunk {sub.chunk_id}: create unsure ({exc}); looking it up")
        try:
            found = await reattach(ctx, job)
        except Refused as refused:
            # The batch may exist: stop, leaving the chunk 'uploaded' for the next run to find.
            raise LookupFailed(f"chunk {sub.chunk_id}: lookup refused ({refused})") from None
        if found:
            return None
        job.retry_at = time.monotonic() + ctx.options.poll_seconds
        return "later"
    except Refused as exc:
        if exc.code == TOKEN_LIMIT:
            return "token_limit"
        raise
    ctx.kill("create")
    await ctx.db(
        store.update,
        ctx.engine,
        sub,
        batch_id=batch.id,
        state="submitted",
        provider_status=batch.status,
        submitted_at=utcnow(),
    )
    ctx.stats_for(job.partition).calls += sub.lines
    return None
