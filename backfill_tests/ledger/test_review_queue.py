"""The review queue's two readers agree: the asset's grouped count is the rows ``review export``
streams, batch by batch, under one policy id only."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.ledger.decisions.review import ReviewQueue, review_counts, review_rows
from backfill_tests.review_helpers import TENANTS, decide, labelled_store


def test_the_count_is_the_rows_streamed_with_or_without_a_threshold(
    engine: Engine, tmp_path: Path
) -> None:
    rubric = labelled_store(engine, tmp_path)
    decide(engine, rubric, "code-club", "rev-0", "ok")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE results SET p_label = 0.3 WHERE post_id LIKE 'leak-%'"))
    for below in (None, 0.5):
        queue = ReviewQueue.of(rubric.policy, below)
        with engine.connect() as conn:
            counts = {c.tenant_id: c.queued for c in review_counts(conn, queue)}
            streamed = {t: list(review_rows(conn, t, queue)) for t in TENANTS}
            # One row a batch streams the same rows in the same order.
            assert {t: list(review_rows(conn, t, queue, batch_rows=1)) for t in TENANTS} == (
                streamed
            )
            only = review_counts(conn, queue, ["learn"])
        assert counts == {t: len(rows) for t, rows in streamed.items() if rows}
        assert [c.tenant_id for c in only] == ["learn"]
        leaks = 0 if below is None else 3 + 2  # learn's and code-club's leak posts
        assert sum(counts.values()) == 4 + 1 + leaks
        assert all(r.source == "model" for rows in streamed.values() for r in rows)


def test_another_policy_id_queues_nothing(engine: Engine, tmp_path: Path) -> None:
    rubric = labelled_store(engine, tmp_path)
    other = ReviewQueue("another-policy", ("needs_review",))
    with engine.connect() as conn:
        assert review_counts(conn, other) == []
        assert list(review_rows(conn, "learn", other)) == []
        assert review_counts(conn, ReviewQueue.of(rubric.policy)) != []
