"""Texts a provider could quote back, and what it wrote about a chunk made safe to store.

A provider's error message may echo the request: the post. Before any such message is stored
(ledger, dead letters, ``batch_submissions.errors``) or logged it is scrubbed against the
texts the request carried, read from ``posts`` only on these error paths. A post changed since
it was sent cannot be checked: then nothing the provider wrote is kept.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from backfill_assets.dispatch.batch.context import BatchContext, ChunkJob
from backfill_assets.domain.caps import ERROR_CODE_CHARS
from backfill_assets.ledger.run import submissions as store
from backfill_assets.providers.batch_wire import BatchObject, OutputLine
from backfill_assets.providers.provider_text import UNCHECKED, scrub


def echoes_of(ctx: BatchContext, key_texts: Sequence[tuple[str, str]]) -> list[str]:
    """What a provider could quote back from these lines: their user messages, as one text
    (a quoted window of any of them is found in it), and posts too short for a window."""
    users = [ctx.rubric.user_message(key, text) for key, text in key_texts]
    return ["\n".join(users), *(t for _k, t in key_texts if len(t) < 16)]


def post_texts(ctx: BatchContext, job: ChunkJob) -> dict[str, str] | None:
    """key -> the text each line was sent with; None if any post changed since."""
    with ctx.engine.connect() as conn:
        found = store.post_texts(conn, job.sub.tenant_id, [ln.post_id for ln in job.lines])
    out: dict[str, str] = {}
    for ln in job.lines:
        got = found.get(ln.post_id)
        if got is None or got[0] != ln.content_hash:
            return None
        out[ln.key] = got[1]
    return out


def chunk_echoes(ctx: BatchContext, job: ChunkJob) -> list[str] | None:
    """What a provider's message about the chunk must not quote (None: a post changed)."""
    texts = post_texts(ctx, job)
    return None if texts is None else echoes_of(ctx, list(texts.items()))


def line_echoes(
    ctx: BatchContext, job: ChunkJob, found: dict[str, OutputLine], closed: set[int]
) -> dict[str, list[str] | None]:
    """For each line whose answer is an error: what it must not quote (its own request).

    None for a line whose post changed since it was sent: its provider text is not kept.
    """
    failing = [
        ln
        for ln in job.lines
        if ln.line_no not in closed
        and (got := found.get(ln.key)) is not None
        and (got.response is None or got.response.status_code != 200)
    ]
    if not failing:
        return {}
    texts = post_texts(ctx, ChunkJob(job.sub, failing, job.partition)) or {}
    if len(texts) < len(failing):
        # Some post changed: read them one by one to know which.
        texts = {}
        for ln in failing:
            one = post_texts(ctx, ChunkJob(job.sub, [ln], job.partition))
            texts.update(one or {})
    return {
        ln.key: echoes_of(ctx, [(ln.key, texts[ln.key])]) if ln.key in texts else None
        for ln in failing
    }


def errors_text(batch: BatchObject, secrets: list[str], echoes: Sequence[str] | None) -> str | None:
    """The batch-level errors as stored JSON: codes, lines and scrubbed messages.

    ``echoes``: the chunk's requests, which a validation message may quote (None: a post
    changed since it was sent, so nothing the provider wrote is kept but the line number).
    """
    if not batch.errors or not batch.errors.data:
        return None

    def clean(text: str) -> str:
        return UNCHECKED if echoes is None else scrub(text, echoes, secrets)

    items = [
        {
            "code": clean(e.code or "")[:ERROR_CODE_CHARS],
            "line": e.line,
            "message": clean(e.message or ""),
        }
        for e in batch.errors.data[:20]
    ]
    return json.dumps(items)
