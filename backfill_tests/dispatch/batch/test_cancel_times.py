"""How long a batch cancel took: the provider's own stamps when it gives them, else the
clock of the process that asked (a resumed process that did not ask, and has no stamps,
does not guess)."""

from __future__ import annotations

from backfill_assets.dispatch.batch.cancels import cancel_seconds
from backfill_assets.providers.batch_wire import BatchObject


def _batch(status: str, **stamps: int) -> BatchObject:
    return BatchObject.model_validate({"id": "batch_1", "status": status, **stamps})


def test_the_providers_stamps_win_over_our_clock() -> None:
    done = _batch("cancelled", cancelling_at=1_000, cancelled_at=1_042)
    assert cancel_seconds(done, asked=50.0, now=51.0) == 42.0
    assert cancel_seconds(done, asked=None, now=51.0) == 42.0


def test_without_stamps_the_time_since_this_process_asked() -> None:
    # A batch that completed while 'cancelling', or a provider without the stamps.
    assert cancel_seconds(_batch("completed", cancelling_at=1_000), 50.0, 61.5) == 11.5
    assert cancel_seconds(_batch("cancelled"), 50.0, 53.0) == 3.0
    assert cancel_seconds(_batch("cancelled"), None, 53.0) is None
