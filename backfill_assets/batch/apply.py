"""A finished batch's lines into the ledger and the results, exactly once per line.

Each line gets its usage or error event (with the attempt id written at intent) and its
outcome through a ``LedgerWriter``, as in sync mode. A process that dies halfway through
leaves the chunk ``ended``; the next run downloads the files again and skips the lines whose
events are already committed, so nothing is booked twice. Only then is the chunk ``applied``.
"""

from __future__ import annotations

import enum
import functools
import json

from ..keys import Versions
from ..models._openai_wire import scrub
from ..outcomes import Outcome
from ..rubric import OutputRejected, parse_output
from ..store import submissions as store
from ..store.tables import utcnow
from ..store.writer import FlushReport, LedgerWriter
from .client import retry
from .context import BatchContext, ChunkJob
from .rows import LineRows
from .triage import LineVerdict, Verdict, triage
from .wire import BatchObject, OutputLine, output_lines


class Ending(enum.StrEnum):
    """How a chunk left the run."""

    APPLIED = "applied"
    REQUEUED = "requeued"  # never ran (enqueued-token limit): its keys go into a new chunk
    FAILED = "failed"  # the provider refused the batch (validation): reported, keys kept


def errors_text(batch: BatchObject, secrets: list[str]) -> str | None:
    """The batch-level errors as stored JSON: codes, lines and scrubbed messages."""
    if not batch.errors or not batch.errors.data:
        return None
    items = [
        {"code": e.code, "line": e.line, "message": scrub(e.message or "", (), secrets)}
        for e in batch.errors.data[:20]
    ]
    return json.dumps(items)


def _builder(ctx: BatchContext, job: ChunkJob) -> LineRows:
    sub = job.sub
    # The chunk's own versions: a batch re-attached after a prompt or model change still
    # books its (paid) lines under the keys they were sent with.
    versions = Versions(sub.task_version, sub.prompt_version, sub.model)
    return LineRows(versions, ctx.run_id, sub.tenant_id, sub.slice, job.partition, sub.chunk_id)


def _writer(ctx: BatchContext) -> LedgerWriter:
    def on_flush(report: FlushReport) -> None:
        # Rows the frame check refused turn from accepted into schema_rejected.
        for row, _reason in report.rejected:
            st = ctx.stats_for(row["partition"])
            st.outcomes[Outcome.ACCEPTED] -= 1
            st.labels[row["label"]] -= 1
            st.outcomes[Outcome.SCHEMA_REJECTED] += 1

    return LedgerWriter(
        ctx.engine,
        flush_rows=ctx.flush_rows,
        flush_interval_s=ctx.flush_interval_s,
        on_flush=on_flush,
    )


async def close_unrun(ctx: BatchContext, job: ChunkJob, message: str, state: str) -> None:
    """Close every line's attempt with an error event (nothing ran, nothing was billed)."""
    closed = await ctx.db(_closed, ctx, job)
    rows = _builder(ctx, job)
    writer = _writer(ctx)
    writer.start()
    try:
        for line in job.lines:
            if line.line_no not in closed:
                writer.stage_event(rows.error(line, None, message))
    finally:
        await writer.close()
    ctx.budgets.settle(job.reservation, 0)
    await ctx.db(store.update, ctx.engine, job.sub, state=state, applied_at=utcnow())


def _closed(ctx: BatchContext, job: ChunkJob) -> set[int]:
    with ctx.engine.connect() as conn:
        return store.closed_lines(conn, job.sub)


async def _download(ctx: BatchContext, file_id: str | None) -> dict[str, OutputLine]:
    if not file_id:
        return {}
    content = await retry(
        functools.partial(ctx.client.content, file_id),
        what=f"download {file_id}",
        base_s=ctx.client.retry_base_s,
        log=ctx.log,
    )
    found, unreadable = output_lines(content)
    if unreadable:
        ctx.log(f"file {file_id}: {unreadable} unreadable line(s); their keys are resubmitted")
    return found


async def apply(ctx: BatchContext, job: ChunkJob) -> Ending:
    """Book an ended batch; returns how the chunk left the run."""
    sub = job.sub
    if sub.provider_status == "failed":
        codes = {str(e.get("code")) for e in json.loads(sub.errors or "[]")}
        if codes == {"token_limit_exceeded"}:
            await close_unrun(ctx, job, "token_limit_exceeded: batch not run", "requeued")
            return Ending.REQUEUED
        await close_unrun(ctx, job, f"batch failed validation: {sorted(codes)}", "failed")
        return Ending.FAILED
    found = await _download(ctx, sub.output_file_id)
    found.update(await _download(ctx, sub.error_file_id))
    ctx.kill("fetch")
    closed = await ctx.db(_closed, ctx, job)
    rows = _builder(ctx, job)
    writer = _writer(ctx)
    writer.start()
    billed = 0
    secrets = [ctx.secret] if ctx.secret else []
    try:
        for line in job.lines:
            if line.line_no in closed:
                continue
            verdict = triage(found.get(line.key), secrets)
            billed += _stage(ctx, job, rows, writer, line, verdict)
    finally:
        await writer.close()
    ctx.budgets.settle(job.reservation, billed)
    await ctx.db(store.update, ctx.engine, sub, state="applied", applied_at=utcnow())
    return Ending.APPLIED


def _stage(
    ctx: BatchContext,
    job: ChunkJob,
    rows: LineRows,
    writer: LedgerWriter,
    line: store.LineRow,
    verdict: LineVerdict,
) -> int:
    """Stage one line's event and outcome; returns the tokens billed for it."""
    st = ctx.stats_for(job.partition)
    if verdict.verdict is Verdict.ANSWERED:
        request_id = verdict.request_id or f"{job.sub.batch_id}:{line.key}"
        tokens = verdict.tokens_in + verdict.tokens_out
        usage = rows.usage(
            line,
            verdict.tokens_in,
            verdict.tokens_out,
            ctx.cost(job.sub.model, verdict.tokens_in, verdict.tokens_out),
            request_id,
        )
        if not verdict.usage_reported:
            usage["message"] = "usage not reported by the provider"
        # Booked before the answer is trusted: a malformed answer still cost tokens.
        writer.stage_event(usage, job.reservation.reservation_id)
        st.tokens_in += verdict.tokens_in
        st.tokens_out += verdict.tokens_out
        st.cost += usage["cost"]
        try:
            out = parse_output(verdict.content, line.key)
        except OutputRejected as exc:
            writer.stage_dead(rows.dead(line, Outcome.SCHEMA_REJECTED, str(exc)))
            st.outcomes[Outcome.SCHEMA_REJECTED] += 1
            return tokens
        writer.stage_result(rows.result(line, out))
        st.outcomes[Outcome.ACCEPTED] += 1
        st.labels[out.label] += 1
        return tokens
    writer.stage_event(rows.error(line, verdict.status, verdict.message))
    if verdict.status == 429:
        st.rate_limited += 1
    if verdict.verdict is Verdict.REJECTED:
        writer.stage_dead(rows.dead(line, Outcome.TRANSPORT_REJECTED, verdict.message))
        st.outcomes[Outcome.TRANSPORT_REJECTED] += 1
    elif ctx.retry.exhausted(line.attempt_no):
        reason = f"{line.attempt_no} attempts; last: {verdict.message}"
        writer.stage_dead(rows.dead(line, Outcome.RETRY_EXHAUSTED, reason))
        st.outcomes[Outcome.RETRY_EXHAUSTED] += 1
        ctx.excluded[job.partition].add(line.key)
    else:
        st.retries += 1  # resubmitted in a new chunk by the runner
    return 0
