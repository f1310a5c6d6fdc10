"""A finished batch's lines into the ledger and the results, exactly once per line.

Each line gets its usage or error event (with the attempt id written at intent) and its
outcome through a ``LedgerWriter``, as in sync mode. A process that dies halfway through
leaves the chunk ``ended``; the next run downloads the files again and skips the lines whose
events are already committed, so nothing is booked twice. Only then is the chunk ``booked``.
"""

from __future__ import annotations

import functools
import json
import tempfile

from backfill_assets.dispatch.batch.context import BatchContext, ChunkJob
from backfill_assets.dispatch.batch.rows import LineRows
from backfill_assets.dispatch.batch.texts import line_echoes
from backfill_assets.dispatch.batch.triage import Disposition, TriagedLine, triage
from backfill_assets.domain.money.budgets import Reservation, Spend, over_bound
from backfill_assets.domain.money.prices import Tier, event_cost
from backfill_assets.domain.policy.dialect_sections import OPENAI_MODERATION
from backfill_assets.domain.policy.output_gate import OutputRejected
from backfill_assets.domain.policy.rubric import MAX_OUTPUT_TOKENS
from backfill_assets.domain.work.keys import Versions
from backfill_assets.domain.work.outcomes import Outcome
from backfill_assets.ledger.run import submissions as store
from backfill_assets.ledger.run.rows import EventRow
from backfill_assets.ledger.run.submissions import ChunkState
from backfill_assets.ledger.run.writer import FlushReport, LedgerWriter
from backfill_assets.ledger.tables import utcnow
from backfill_assets.providers.batch_client import retry
from backfill_assets.providers.batch_wire import OutputLine, output_lines
from backfill_assets.providers.bounded_body import BadBody
from backfill_assets.providers.models.base import RunFatalError
from backfill_assets.providers.models.errors import Scope, classify


def _builder(ctx: BatchContext, job: ChunkJob) -> LineRows:
    sub = job.sub
    # The chunk's own versions: a batch re-attached after a prompt or model change still
    # books its (paid) lines under the keys they were sent with.
    versions = Versions(sub.task_version, sub.key_version, sub.model)
    return LineRows(versions, ctx.run_id, sub.tenant_id, sub.slice, job.partition, sub.chunk_id)


def _writer(ctx: BatchContext) -> LedgerWriter:
    def on_flush(report: FlushReport) -> None:
        # Rows the frame check refused turn from accepted into schema_rejected.
        for row, _reason in report.rejected:
            st = ctx.stats_for(row["partition"])
            st.outcomes[Outcome.ACCEPTED] -= 1
            st.labels[row["label"]] -= 1
            st.note_p_label(row["p_label"], -1)
            st.outcomes[Outcome.SCHEMA_REJECTED] += 1

    return LedgerWriter(
        ctx.engine,
        ctx.fence,
        contract_for=ctx.contract_for,
        flush_rows=ctx.flush_rows,
        flush_interval_s=ctx.flush_interval_s,
        on_flush=on_flush,
    )


async def close_unrun(ctx: BatchContext, job: ChunkJob, message: str, state: ChunkState) -> None:
    """Close every line's attempt with an error event (nothing ran, nothing was billed)."""
    closed = await ctx.db(_closed, ctx, job)
    rows = _builder(ctx, job)
    writer = _writer(ctx)
    writer.start()
    try:
        for line in job.lines:
            if line.line_no not in closed:
                # Nothing was billed: the line's bound leaves the chunk's reservation.
                writer.stage_event(rows.error(line, None, message), chunk=_release(job, line))
    finally:
        await writer.close()
    await ctx.db(store.update, ctx.fence, job.sub, state=state, booked_at=utcnow())


def _closed(ctx: BatchContext, job: ChunkJob) -> set[int]:
    with ctx.engine.connect() as conn:
        return store.closed_lines(conn, job.sub)


async def _download(ctx: BatchContext, file_id: str | None) -> dict[str, OutputLine]:
    if not file_id:
        return {}
    # On disk, not in memory: an output file may be hundreds of MB (or a hostile endless one,
    # cut at BACKFILL_BATCH_MAX_OUTPUT_BYTES). TemporaryFile is 0600 and has no name.
    with tempfile.TemporaryFile() as out:
        await retry(
            functools.partial(ctx.client.content, file_id, out, ctx.options.max_output_bytes),
            what=f"download {file_id}",
            policy=ctx.client.retries,
            log=ctx.log,
        )
        out.seek(0)
        found, unreadable = output_lines(out)
    if unreadable:
        ctx.log(f"file {file_id}: {unreadable} unreadable line(s); their keys are resubmitted")
    return found


def _release(job: ChunkJob, line: store.LineRow) -> tuple[str, Spend]:
    """What the line holds of its chunk's reservation: its bound.

    Lines recorded before sql/005 (sql/015 for nano-dollars) have none: they hold an equal
    share of the chunk's.
    """
    share = max(1, job.sub.lines)
    tokens = line.bound_tokens
    if tokens is None:
        tokens = job.sub.reserved_tokens // share
    nanos = line.bound_nanos
    if nanos is None:
        nanos = job.sub.reserved_nanos // share
    return job.sub.chunk_id, Spend(tokens, nanos)


def _failed_scope(sub: store.Submission) -> Scope:
    """What the error codes of a failed batch mean (one taxonomy with sync mode)."""
    scopes = {classify(None, str(e.get("code"))) for e in json.loads(sub.errors or "[]")}
    if Scope.RUN in scopes:
        return Scope.RUN
    return Scope.TOKEN_LIMIT if scopes == {Scope.TOKEN_LIMIT} else Scope.KEY


async def book(ctx: BatchContext, job: ChunkJob) -> ChunkState:
    """Book an ended batch; returns how the chunk left the run.

    A run-level answer (a failed batch's account code, a line answered 401/403/404) leaves
    the keys pending and sets ``ctx.fatal``: the runner stops the run after this chunk.
    """
    sub = job.sub
    if sub.provider_status == "failed":
        scope = _failed_scope(sub)
        if scope is Scope.TOKEN_LIMIT:
            await close_unrun(ctx, job, "token_limit_exceeded: batch not run", ChunkState.REQUEUED)
            return ChunkState.REQUEUED
        if scope is Scope.RUN:
            await close_unrun(
                ctx, job, "batch refused for the account: not run", ChunkState.REQUEUED
            )
            ctx.fatal = ctx.fatal or RunFatalError(
                f"batch {sub.batch_id} failed with a run-level error: {sub.errors}",
                status=None,
                endpoint=f"batch {sub.batch_id}",
            )
            return ChunkState.REQUEUED
        codes = sorted({str(e.get("code")) for e in json.loads(sub.errors or "[]")})
        await close_unrun(ctx, job, f"batch failed validation: {codes}", ChunkState.FAILED)
        return ChunkState.FAILED
    try:
        found = await _download(ctx, sub.output_file_id)
        found.update(await _download(ctx, sub.error_file_id))
    except BadBody as exc:
        # Nothing in it can be read: the chunk fails, reported; its keys stay pending, and
        # what the provider billed for it is on the provider's invoice, not in the ledger.
        ctx.log(f"chunk {sub.chunk_id}: batch {sub.batch_id} output not read: {exc}")
        await close_unrun(ctx, job, f"batch output not read: {exc}", ChunkState.FAILED)
        return ChunkState.FAILED
    ctx.reached("fetch")
    closed = await ctx.db(_closed, ctx, job)
    echoes = await ctx.db(line_echoes, ctx, job, found, closed)
    rows = _builder(ctx, job)
    writer = _writer(ctx)
    writer.start()
    secrets = [ctx.secret] if ctx.secret else []
    moderation = ctx.rubric.dialect == OPENAI_MODERATION
    try:
        for line in job.lines:
            if line.line_no in closed:
                continue
            triaged = triage(found.get(line.key), secrets, echoes.get(line.key, ()), moderation)
            _stage(ctx, job, rows, writer, line, triaged)
    finally:
        await writer.close()
    await ctx.db(store.update, ctx.fence, sub, state=ChunkState.BOOKED, booked_at=utcnow())
    return ChunkState.BOOKED


def _stage(
    ctx: BatchContext,
    job: ChunkJob,
    rows: LineRows,
    writer: LedgerWriter,
    line: store.LineRow,
    triaged: TriagedLine,
) -> None:
    """Stage one line's event and outcome."""
    st = ctx.stats_for(job.partition)
    release = _release(job, line)
    if triaged.disposition is Disposition.ANSWERED:
        usage = _usage(ctx, job, rows, line, triaged, release[1])
        # Booked before the answer is trusted: a malformed answer still cost tokens.
        writer.stage_event(usage, chunk=release)
        st.tokens_in += usage["tokens_in"]
        st.tokens_out += usage["tokens_out"]
        st.cost_nanos += usage["cost_nanos"]
        reader = ctx.reader_for(job.sub.key_version)
        try:
            if reader is None:
                raise OutputRejected("output contract: no policy registered for its version")
            out, p_label = reader.read(triaged.content, line.key, triaged.logprobs)
        except OutputRejected as exc:
            writer.stage_dead(rows.dead(line, Outcome.SCHEMA_REJECTED, str(exc)))
            st.outcomes[Outcome.SCHEMA_REJECTED] += 1
            return
        writer.stage_result(rows.result(line, out, p_label, reader.stored(triaged.content)))
        st.outcomes[Outcome.ACCEPTED] += 1
        st.labels[out.label] += 1
        st.note_p_label(p_label)
        return
    writer.stage_event(rows.error(line, triaged.status, triaged.message), chunk=release)
    if triaged.status == 429:
        st.rate_limited += 1
    if triaged.disposition is Disposition.FATAL:
        # Not the key's fault (our key, permission or model): pending for a fixed run.
        ctx.excluded[job.partition].add(line.key)
        st.outcomes[Outcome.DEFERRED] += 1
        ctx.fatal = ctx.fatal or RunFatalError(
            f"{triaged.message} (batch {job.sub.batch_id})",
            status=triaged.status,
            endpoint=f"batch {job.sub.batch_id} line {line.line_no}",
        )
    elif triaged.disposition is Disposition.REJECTED:
        writer.stage_dead(rows.dead(line, Outcome.TRANSPORT_REJECTED, triaged.message))
        st.outcomes[Outcome.TRANSPORT_REJECTED] += 1
    elif ctx.retry.exhausted(line.attempt_no):
        reason = f"{line.attempt_no} attempts; last: {triaged.message}"
        writer.stage_dead(rows.dead(line, Outcome.RETRY_EXHAUSTED, reason))
        st.outcomes[Outcome.RETRY_EXHAUSTED] += 1
        ctx.excluded[job.partition].add(line.key)
    else:
        st.retries += 1  # resubmitted in a new chunk by the runner


def _usage(
    ctx: BatchContext,
    job: ChunkJob,
    rows: LineRows,
    line: store.LineRow,
    triaged: TriagedLine,
    reserved: Spend,
) -> EventRow:
    """The line's usage event, booked like sync mode's (``dispatch._book_usage``)."""
    bound = reserved.tokens
    shape, tokens_in, tokens_out = triaged.usage_shape, triaged.tokens_in, triaged.tokens_out
    if shape == "missing":
        # No usage at all: the most the line could have cost, never 0, flagged.
        tokens_in, tokens_out = bound - MAX_OUTPUT_TOKENS, MAX_OUTPUT_TOKENS
    cached, written = triaged.tokens_cached, triaged.tokens_cache_written
    if shape == "missing":
        cached = written = 0
    # Priced as sync mode prices a call (a total-only usage as the dearest split it allows).
    tokens = (tokens_in, cached, written, tokens_out)
    cost = event_cost(ctx.prices, job.sub.model, Tier.BATCH, shape, tokens, MAX_OUTPUT_TOKENS)
    request_id = triaged.request_id or f"{job.sub.batch_id}:{line.key}"
    usage = rows.usage(line, tokens_in, tokens_out, cost, request_id, shape, bound)
    booked = ctx.prices.booked(job.sub.model, Tier.BATCH)
    usage.update(
        {
            "tokens_cached": cached,
            "tokens_cache_written": written,
            "tokens_reasoning": 0 if shape == "missing" else triaged.tokens_reasoning,
            "service_tier": Tier.BATCH.value,
            "price_booked": None if booked is None else booked.to_json(),
            "cost_unknown": int(booked is None),
        }
    )
    if shape == "missing":
        usage["message"] = "usage_missing: the provider reported no usage; booked the bound"
    # Lines recorded before a bound was kept are not judged against one.
    reservation = Reservation(
        job.sub.tenant_id,
        None,
        reserved,
        priced=booked is not None and line.bound_nanos is not None,
    )
    over = over_bound(Spend(tokens_in + tokens_out, cost), reservation)
    if line.bound_tokens is not None and over:
        # Past any byte-level tokenizer's count: the cap can no longer be promised for this
        # tenant, so it gets no new chunk in this run (as in sync mode).
        usage["message"] = over
        tenant = job.sub.tenant_id
        if tenant not in ctx.stopped_tenants:
            ctx.stopped_tenants[tenant] = over
            ctx.log(
                f"ERROR: tenant {tenant}: provider {over}; stopping this tenant "
                "(see the spend check and verify)"
            )
    return usage
