"""The planner's pending counts agree with the work query a run sends, case by case.

``pending_counts`` (one grouped query for the whole store: which partitions have work) and
``pending_posts`` (a partition's keys to send) are written differently for speed; a post they
disagree about is a partition skipped with work left, or a run started for nothing.
``sendable_count`` (a deadline plan's steps) counts the same keys as ``pending_posts``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.domain.work.keys import SLICE_COUNT, Versions, content_hash, work_key
from backfill_assets.ledger.run.work import (
    pending_by_partition,
    pending_counts,
    pending_posts,
    sendable_count,
)
from backfill_assets.ledger.tables import dead_letters, results
from backfill_tests.conftest import import_records

V = Versions("task-1", "prompt-1", "model-1")
OTHER = Versions("task-1", "prompt-2", "model-1")


def _row(versions: Versions, tenant: str, post_id: str, text: str, slice_no: int) -> dict[str, Any]:
    h = content_hash(text)
    return {
        "key": work_key(versions, tenant, post_id, h),
        "tenant_id": tenant,
        "post_id": post_id,
        "slice": slice_no,
        "content_hash": h,
        "model": versions.model,
        "key_version": versions.key_version,
        "task_version": versions.task_version,
        "run_id": "test",
    }


def test_pending_counts_match_the_work_query_in_every_case(engine: Engine, tmp_path: Path) -> None:
    texts = {f"p{i}": f"post {i}" for i in range(12)}
    import_records(
        engine,
        tmp_path,
        [
            {"tenant_id": t, "post_id": p, "text": x}
            for t in ("acme", "beta")
            for p, x in texts.items()
        ],
    )
    with engine.begin() as conn:
        slices = {
            (t, p): s
            for t, p, s in conn.execute(sa.text("SELECT tenant_id, post_id, slice FROM posts"))
        }

        def result(versions: Versions, tenant: str, post_id: str, text: str) -> None:
            row = _row(versions, tenant, post_id, text, slices[(tenant, post_id)])
            conn.execute(
                results.insert().values(
                    **row, label="ok", confidence=0.5, created_at=sa.func.current_timestamp()
                )
            )

        def dead(tenant: str, post_id: str, outcome: str) -> None:
            row = _row(V, tenant, post_id, texts[post_id], slices[(tenant, post_id)])
            conn.execute(
                dead_letters.insert().values(
                    **row, outcome=outcome, reason="r", attempts=1, at=sa.func.current_timestamp()
                )
            )

        result(V, "acme", "p0", texts["p0"])  # done
        result(V, "acme", "p1", "an older text")  # the post was edited since: pending
        result(OTHER, "acme", "p2", texts["p2"])  # done under another prompt only: pending
        result(V, "beta", "p0", texts["p0"])  # done (the same post id of another tenant)
        dead("acme", "p3", "schema_rejected")  # final: not pending
        dead("acme", "p4", "transport_rejected")  # final: not pending
        dead("acme", "p5", "retry_exhausted")  # retried by a later run: pending
        result(V, "acme", "p6", texts["p6"])  # done, and an older dead letter left over
        dead("acme", "p6", "retry_exhausted")
    with engine.connect() as conn:
        counts = pending_counts(conn, None, V)
        subset = pending_counts(conn, ["acme"], V)
        sent: Counter[tuple[str, int]] = Counter()
        for tenant in ("acme", "beta"):
            for s in range(SLICE_COUNT):
                sent[(tenant, s)] = len(pending_posts(conn, tenant, [s], V))
        # The deadline steps' count of what a synchronous run would send: the same keys.
        sendable = sendable_count(conn, ["acme", "beta"], V), sendable_count(conn, ["acme"], V)
        # Many partitions read in one query (small tenants): each gets what it alone would.
        # One partition per tenant and slice, except beta's slices 0-7, held by one partition.
        owners = {(t, s): f"{t}-{s}" for t in ("acme", "beta") for s in range(SLICE_COUNT)}
        owners.update({("beta", s): "beta-low" for s in range(8)})
        grouped = pending_by_partition(conn, owners, V)
        beta_low = pending_posts(conn, "beta", range(8), V)
    by_key = {f"{t}-{s}": n for (t, s), n in sent.items() if not (t == "beta" and s < 8)}
    assert {k: len(v) for k, v in grouped.items()} == {**by_key, "beta-low": len(beta_low)}
    assert sorted(p.post_id for p in grouped["beta-low"]) == sorted(p.post_id for p in beta_low)
    assert {k: p for k, (_n, p) in counts.items()} == {k: n for k, n in sent.items() if k in counts}
    assert sum(p for _n, p in counts.values()) == 12 * 2 - 5  # p0 x2, p3, p4, p6 are finished
    assert sum(n for n, _p in counts.values()) == 24  # every post counted once
    assert subset == {k: v for k, v in counts.items() if k[0] == "acme"}
    assert sendable == (sum(sent.values()), sum(n for k, n in sent.items() if k[0] == "acme"))
