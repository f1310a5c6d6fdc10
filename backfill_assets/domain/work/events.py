"""The kinds of ledger event (``ledger_events.type``, the CHECK list of ``sql/001``)."""

from __future__ import annotations

import enum


class EventKind(enum.StrEnum):
    """What a ledger row records about one call."""

    ATTEMPT = "attempt"  # committed before the call is sent
    USAGE = "usage"  # what the provider billed for it, booked before the answer is parsed
    ERROR = "error"  # the call failed, or its batch never ran: nothing billed
