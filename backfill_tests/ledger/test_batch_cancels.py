"""``ledger/run/batch_cancels.py`` (sql/020): how long batch cancels took, per endpoint and model,
newest first; a batch's first observation holds (both stores)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy.engine import Engine

from backfill_assets.ledger.engine import read_tx, write_tx
from backfill_assets.ledger.run.batch_cancels import cancel_durations, endpoint_id, record_cancel

T0 = dt.datetime(2026, 12, 1, 12, 0)
HERE = "https://api.example/v1"


def test_the_newest_cancels_per_endpoint_and_model(engine: Engine) -> None:
    with write_tx(engine) as conn:
        for i in range(25):
            record_cancel(conn, f"b{i}", HERE, "m", float(i), T0 + dt.timedelta(minutes=i))
        record_cancel(conn, "other-model", HERE, "m2", 900.0, T0)
        record_cancel(conn, "elsewhere", "https://other.example/v1", "m", 900.0, T0)
        # Seen again (a resumed run polls it once more): the first observation holds.
        record_cancel(conn, "b24", HERE, "m", 1.0, T0 + dt.timedelta(hours=1))
    with read_tx(engine) as conn:
        got = cancel_durations(conn, [HERE, "https://none.example/v1"], "m")
    assert got == {HERE: [float(i) for i in range(24, 4, -1)]}


def test_an_endpoint_is_its_base_url_without_its_password() -> None:
    assert endpoint_id("https://api.example/v1/") == HERE
    assert endpoint_id("https://user:s3cret@api.example/v1") == "https://user:***@api.example/v1"
