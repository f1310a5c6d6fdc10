"""Batch mode settings: where the Batch API is and how a run uses it (plain values)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

from backfill_assets.domain.work.faults import PointHook
from backfill_assets.providers.batch_client import BatchEndpoint

# OpenAI's limits per batch input file.
PROVIDER_MAX_LINES = 50_000
PROVIDER_MAX_FILE_BYTES = 200 * 1024 * 1024


@dataclass(frozen=True)
class BatchOptions:
    """How a batch-mode run chunks, polls and (in drills) dies."""

    endpoint: BatchEndpoint | None = None
    max_lines: int = PROVIDER_MAX_LINES
    # A margin under the provider's 200 MB for the multipart envelope.
    max_file_bytes: int = PROVIDER_MAX_FILE_BYTES - 1024 * 1024
    # The largest output or error file read back; past it the chunk fails, reported.
    max_output_bytes: int = 512 * 1024 * 1024
    poll_seconds: float = 30.0
    max_poll_seconds: float = 600.0
    # After a create with no answer, how long to keep looking for its batch in the provider's
    # list (which may lag behind creates) before creating the chunk's batch again.
    create_lookup_seconds: float = 600.0
    # A crash drill's hook, called at each named point (domain/work/faults.py); None outside drills.
    at_point: PointHook | None = field(default=None, repr=False, compare=False)
    # A deadline plan's share of the run (``runner/deadline_run.py``); unset, a batch
    # run takes every pending key and waits for every batch. ``quota``: the most keys per
    # tenant put into new chunks. ``submit_only``: return once every chunk is at the
    # provider. ``switch_at``: at this epoch second, cancel what is still open, book what it
    # returned and leave the rest pending for a synchronous tier.
    quota: Mapping[str, int] | None = None
    submit_only: bool = False
    switch_at: float | None = None
    # How long the plan allows a cancel to take; one that takes longer is waited for all the
    # same (a line may still complete and bill), and the log says so.
    cancel_s: float | None = None
    # The httpx seam: tests pass an ``httpx.MockTransport``; never set from configuration.
    transport: httpx.AsyncBaseTransport | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.max_lines <= PROVIDER_MAX_LINES:
            raise ValueError(f"batch max lines must be within 1..{PROVIDER_MAX_LINES}")
        if self.poll_seconds <= 0 or self.max_poll_seconds < self.poll_seconds:
            raise ValueError("batch poll seconds must be > 0 and <= the maximum poll interval")
        if self.create_lookup_seconds < 0:
            raise ValueError("batch create lookup seconds must be >= 0")
