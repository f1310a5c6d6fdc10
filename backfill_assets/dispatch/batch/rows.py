"""Ledger events, results and dead letters of batch lines, shaped like the sync dispatcher's.

The same shapes go through the same ``LedgerWriter``, so ``verify`` and the checks account
for batch mode unchanged: an attempt per line at intent, then a usage or error event with the
same attempt id, committed together with the key's outcome.
"""

from __future__ import annotations

from dataclasses import dataclass

from backfill_assets.domain.caps import ERROR_MESSAGE_CHARS, REQUEST_ID_CHARS
from backfill_assets.domain.policy.output_gate import ModerationOutput
from backfill_assets.domain.work.events import EventKind
from backfill_assets.domain.work.keys import Versions
from backfill_assets.domain.work.outcomes import Outcome
from backfill_assets.ledger.run.rows import (
    DeadRow,
    EventRow,
    KeyRow,
    ResultRow,
    dead_row,
    event_row,
    key_row,
    result_row,
)
from backfill_assets.ledger.run.submissions import LineRow, attempt_id


@dataclass(frozen=True)
class LineRows:
    """Row builders for one chunk's lines."""

    versions: Versions
    run_id: str
    tenant_id: str
    slice: int
    partition: str
    chunk_id: str

    def _event(self, line: LineRow, kind: str) -> EventRow:
        return event_row(
            self.versions,
            self.run_id,
            kind,
            key=line.key,
            tenant_id=self.tenant_id,
            slice_no=self.slice,
            attempt_id=attempt_id(self.chunk_id, line.line_no),
            attempt_no=line.attempt_no,
            post_id=line.post_id,
            content_hash=line.content_hash,
        )

    def attempt(self, line: LineRow) -> EventRow:
        """Written with the chunk's intent, before the upload."""
        return self._event(line, EventKind.ATTEMPT)

    def usage(
        self,
        line: LineRow,
        tokens_in: int,
        tokens_out: int,
        cost_nanos: int,
        request_id: str,
        usage_shape: str = "split",
        bound: int | None = None,
    ) -> EventRow:
        """What the provider billed for the line (at the batch price), in the shape it was
        reported (sql/004), with the bound reserved for it."""
        row = self._event(line, EventKind.USAGE)
        row["tokens_in"], row["tokens_out"], row["cost_nanos"] = tokens_in, tokens_out, cost_nanos
        row["request_id"] = request_id[:REQUEST_ID_CHARS]
        row["status"] = 200
        row["usage_shape"] = usage_shape
        row["bound_tokens"] = bound
        return row

    def error(self, line: LineRow, status: int | None, message: str) -> EventRow:
        """A line that produced no billed answer (closes its attempt)."""
        row = self._event(line, EventKind.ERROR)
        row["status"], row["message"] = status, message[:ERROR_MESSAGE_CHARS]
        return row

    def _base(self, line: LineRow) -> KeyRow:
        return key_row(
            self.versions,
            self.run_id,
            key=line.key,
            tenant_id=self.tenant_id,
            post_id=line.post_id,
            slice_no=self.slice,
            content_hash=line.content_hash,
        )

    def result(
        self,
        line: LineRow,
        out: ModerationOutput,
        p_label: float | None = None,
        stored: tuple[str, str] | None = None,
    ) -> ResultRow:
        """An accepted label (the writer validates it again as a frame)."""
        # Clears an earlier retry_exhausted dead letter of the key, if any.
        return result_row(self._base(line), out, self.partition, True, p_label, stored)

    def dead(self, line: LineRow, outcome: Outcome, reason: str) -> DeadRow:
        """A dead letter (replaces any earlier one for the key)."""
        return dead_row(self._base(line), outcome, reason, line.attempt_no)
