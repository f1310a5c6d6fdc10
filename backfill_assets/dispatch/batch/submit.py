"""From pending keys to a batch at the provider: plan, reserve, intent, upload, create.

Every step is recorded before the next one starts, and each provider id is stored the moment
it is returned; a chunk whose process died in between is re-attached (``find``), never
created twice.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence

from backfill_assets.dispatch.batch.chunks import ChunkLine, chunk_base, chunk_id, split
from backfill_assets.dispatch.batch.context import BatchContext, ChunkJob
from backfill_assets.dispatch.batch.rows import LineRows
from backfill_assets.dispatch.batch.texts import echoes_of, post_texts
from backfill_assets.domain.money.budgets import UNPRICED_UNDER_DOLLAR_CAP, Caps, Spend
from backfill_assets.domain.money.prices import Tier
from backfill_assets.domain.policy.rubric import MAX_OUTPUT_TOKENS, call_token_bound
from backfill_assets.domain.work.keys import work_key
from backfill_assets.ledger.run import submissions as store
from backfill_assets.ledger.run.submissions import ChunkState
from backfill_assets.ledger.run.work import PendingPost
from backfill_assets.ledger.spend import budget
from backfill_assets.ledger.tables import utcnow
from backfill_assets.providers.batch_client import Refused, retry
from backfill_assets.providers.batch_wire import input_line
from backfill_assets.providers.models.base import ModelRequest

# A concurrent grant may take what a chunk was cut for; cut it again this many times.
_ADMIT_TRIES = 3
# Lookups of an unsure create back off from the poll interval up to this.
_MAX_LOOKUP_GAP_S = 60.0


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
        contract=ctx.rubric.contract,
    )
    return input_line(request, ctx.max_tokens_param, ctx.endpoint, logprobs=ctx.logprobs)


def _free(ctx: BatchContext, tenant_id: str) -> tuple[Caps, Spend]:
    return budget.free_for(ctx.engine, tenant_id, ctx.budget_tokens)


def _fitting(caps: Caps, free: Spend, bounds: Sequence[Spend], priced: bool) -> int:
    """How many of ``bounds``, in order, fit the free budget together."""
    if caps.nanos is not None and not priced:
        return 0  # a dollar cap cannot be kept for a model without a price
    total, n = Spend(), 0
    for bound in bounds:
        total += bound
        if caps.exceeds(total, free):
            break
        n += 1
    return n


async def plan(
    ctx: BatchContext,
    partition: str,
    tenant_id: str,
    slice_no: int,
    pending: Sequence[PendingPost],
    max_lines: int,
) -> tuple[list[ChunkJob], list[str]]:
    """Chunks (intent recorded) for ``pending``, and the keys deferred by the budget.

    Each chunk reserves the sum of its lines' upper bounds (``rubric.call_token_bound``, and
    its cost at the batch price), not an estimate: whatever the provider's tokenizer, the chunk
    cannot bill more. If a cap is short, the longest prefix that fits is recorded and the rest
    is deferred.
    """
    prior = await ctx.db(_prior, ctx, tenant_id, slice_no)
    lines: list[ChunkLine] = []
    for p in pending:
        key = work_key(ctx.versions, tenant_id, p.post_id, p.content_hash)
        lines.append(ChunkLine(key, p.post_id, p.content_hash, p.text, prior.get(key, 0) + 1))
    # Sorted by key: the same pending keys always give the same chunks and file bytes.
    lines.sort(key=lambda ln: ln.key)
    encoded = [_line_bytes(ctx, tenant_id, ln) for ln in lines]
    bounds, priced = _bounds(ctx, lines)
    # A cascade's stage: each line also holds what the stages after it may cost for the post,
    # in the chunk's reservation (never in the line's own bound, which its bill is judged by).
    held = bounds
    if ctx.ahead is not None and ctx.budgets:
        held = [b + ctx.ahead(ln.text) for b, ln in zip(bounds, lines, strict=True)]
    jobs: list[ChunkJob] = []
    for span in split([len(b) for b in encoded], max_lines, ctx.options.max_file_bytes):
        job = None
        for _ in range(_ADMIT_TRIES):
            n = len(span)
            if ctx.budgets:
                caps, free = await ctx.db(_free, ctx, tenant_id)
                if caps.any:
                    n = _fitting(caps, free, held[span.start : span.stop], priced)
                if n == 0 and caps.nanos is not None and not priced:
                    ctx.log(f"{tenant_id}: {UNPRICED_UNDER_DOLLAR_CAP}: its keys are deferred")
            if n == 0:
                break
            content = b"".join(encoded[span.start : span.start + n])
            chosen = lines[span.start : span.start + n]
            job = await _intent(
                ctx,
                partition,
                tenant_id,
                slice_no,
                chosen,
                (bounds[span.start :], held[span.start :]),
                content,
            )
            if job is not None:
                break
        if job is None:
            break
        jobs.append(job)
        if job.sub.lines < len(span):
            break  # the budget ran out inside this chunk: the rest waits for a later run
    planned = {ln.key for job in jobs for ln in job.lines}
    return jobs, [ln.key for ln in lines if ln.key not in planned]


def _bounds(ctx: BatchContext, lines: Sequence[ChunkLine]) -> tuple[list[Spend], bool]:
    """Each line's most tokens and nano-dollars at the batch price, and whether the model
    has a price (if not, the nanos are 0)."""
    out: list[Spend] = []
    priced = True
    for ln in lines:
        tokens = call_token_bound(ctx.rubric, ln.key, ln.text)
        nanos = ctx.prices.cost_bound(
            ctx.versions.model, [Tier.BATCH], tokens - MAX_OUTPUT_TOKENS, MAX_OUTPUT_TOKENS
        )
        priced = priced and nanos is not None
        out.append(Spend(tokens, nanos or 0))
    return out, priced


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
    bounds_held: tuple[Sequence[Spend], Sequence[Spend]],
    content: bytes,
) -> ChunkJob | None:
    """Record the chunk with its reservation (what its lines hold); None if the cap no longer
    admits it. Each line keeps its own bound."""
    bounds, held = bounds_held
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
        key_version=v.key_version,
        task_version=v.task_version,
        lines=len(lines),
        file_sha256=hashlib.sha256(content).hexdigest(),
        file_bytes=len(content),
        run_id=ctx.run_id,
        intent_at=utcnow(),
        # The chunk's reservation: held in this row while the chunk is open (sql/005, 015).
        reserved_tokens=sum(b.tokens for b in held[: len(lines)]),
        reserved_nanos=sum(b.nanos for b in held[: len(lines)]),
    )
    rows = [
        store.LineRow(
            n, ln.key, ln.post_id, ln.content_hash, ln.attempt_no, bound.tokens, bound.nanos
        )
        for (n, ln), bound in zip(enumerate(lines, start=1), bounds, strict=False)
    ]
    builder = LineRows(v, ctx.run_id, tenant_id, slice_no, partition, sub.chunk_id)
    admit = None
    if ctx.budgets:
        admit = functools.partial(
            budget.admits,
            ctx.engine,
            tenant_id=tenant_id,
            need=Spend(sub.reserved_tokens, sub.reserved_nanos),
            default_tokens=ctx.budget_tokens,
        )
    attempts = [builder.attempt(r) for r in rows]
    if not await ctx.db(store.record_intent, ctx.fence, sub, rows, attempts, admit):
        return None
    ctx.reached("intent")
    # The file is not kept: ``upload`` rebuilds it from the posts, so memory holds one file at
    # a time however many chunks a run plans, and a resumed chunk takes the same path.
    return ChunkJob(sub, rows, partition)


def rebuild(ctx: BatchContext, job: ChunkJob) -> tuple[bytes, list[str]] | None:
    """The chunk's file, rebuilt from its lines and the posts (it must match the intent's hash),
    and what an error answer must not quote (``echoes_of`` its lines).

    None if a post changed since the intent (after a crash, say): the chunk is abandoned.
    """
    sub = job.sub
    texts = post_texts(ctx, job)
    if texts is None:
        return None
    parts: list[bytes] = []
    for ln in job.lines:
        chunk_line = ChunkLine(ln.key, ln.post_id, ln.content_hash, texts[ln.key], ln.attempt_no)
        parts.append(_line_bytes(ctx, sub.tenant_id, chunk_line))
    content = b"".join(parts)
    if hashlib.sha256(content).hexdigest() != sub.file_sha256:
        return None
    return content, echoes_of(ctx, list(texts.items()))


async def upload(ctx: BatchContext, job: ChunkJob) -> None:
    """Upload the chunk's file and store its id at once."""
    rebuilt = await ctx.db(rebuild, ctx, job)
    if rebuilt is None:
        raise Refused("the chunk's posts changed before its file was uploaded", code="stale")
    content, echoes = rebuilt
    file_id = await retry(
        functools.partial(ctx.client.upload, f"{job.sub.chunk_id}.jsonl", content, echoes),
        what=f"upload {job.sub.chunk_id}",
        policy=ctx.client.retries,
        log=ctx.log,
    )
    ctx.reached("upload")
    await ctx.db(store.update, ctx.fence, job.sub, file_id=file_id, state=ChunkState.UPLOADED)
