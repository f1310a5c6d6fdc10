"""The writer's bulk inserts keep every value exactly, on both stores (COPY on PostgreSQL)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from backfill_assets.ledger.bulk import insert_rows, select_rows
from backfill_assets.ledger.engines import engine_for
from backfill_assets.ledger.run.writer import (
    DEAD_COLUMNS,
    DEAD_UPSERT,
    EVENT_COLUMNS,
    RESULT_COLUMNS,
)
from backfill_assets.ledger.tables import dead_letters, ledger_events, results, utcnow

# What a hostile provider echoes back in an error message: COPY's own escapes, a literal
# "\N" (COPY's NULL), tabs, newlines, quotes, non-ASCII.
HOSTILE = [
    "\\N",
    "a\tb",
    "line\nnext\r\n",
    "cr\ronly",
    "lf\nonly",
    "back\\slash",
    "'\"; DROP TABLE x; --",
    "é ✓ 𝄞",
    "",
]


@pytest.mark.parametrize("n", [1, 300])
def test_ledger_rows_round_trip_exactly(store_url: str, n: int) -> None:
    engine = engine_for(store_url)
    now = utcnow()
    rows = []
    for i in range(n):
        message = HOSTILE[i % len(HOSTILE)]
        rows.append(
            {
                "tenant_id": "acme",
                "key": f"{i:064x}",
                "attempt_id": f"a-{i}",
                "attempt_no": i,
                "type": "error" if i % 2 else "usage",
                "slice": i % 16,
                "post_id": None if i % 3 else f"p{i}",
                "content_hash": None,
                "model": "m",
                "key_version": None,
                "task_version": None,
                "tokens_in": 2**40 + i,
                "tokens_out": 0,
                "cost_nanos": 10**15 + i,
                "request_id": message,
                "status": 429 if i % 2 else None,
                "message": message,
                "run_id": "run",
                "usage_shape": None,
                "bound_tokens": i,
                "tokens_cached": i // 2,
                "tokens_cache_written": 0,
                "service_tier": "flex" if i % 3 else None,
                "price_booked": '{"tier":"flex","input":"0.075"}' if i % 3 else None,
                "cost_unknown": i % 2,
                "tokens_reasoning": i // 3,
                "at": now,
            }
        )
    with engine.begin() as conn:
        insert_rows(conn, ledger_events, EVENT_COLUMNS, rows)
    with engine.connect() as conn:
        got = [
            dict(r._mapping)
            for r in conn.execute(sa.select(ledger_events).order_by(ledger_events.c.attempt_no))
        ]
    assert len(got) == n
    for want, row in zip(rows, got, strict=True):
        for col in EVENT_COLUMNS:
            if col == "at":
                assert row[col] == now
            else:
                assert row[col] == want[col], col
    # Read back through select_rows (the driver's own rows on SQLite): the same values and
    # order as SQLAlchemy's, as tuples and by column name, with an IN list expanded.
    cols = [c for c in EVENT_COLUMNS if c != "at"]
    stmt = (
        sa.select(*(ledger_events.c[c] for c in cols))
        .where(ledger_events.c.slice.in_([0, 3, 5]))
        .order_by(ledger_events.c.attempt_no)
    )
    with engine.connect() as conn:
        expected = [tuple(r) for r in conn.execute(stmt)]
        assert [tuple(r) for r in select_rows(conn, stmt)] == expected
        named = select_rows(conn, stmt, by_name=True)
    assert [tuple(r[c] for c in cols) for r in named] == expected
    assert expected and len(expected) == sum(1 for r in rows if r["slice"] in (0, 3, 5))


def _result(i: int, post_id: str) -> dict[str, object]:
    return {
        "key": f"{i:064x}",
        "tenant_id": "acme",
        "post_id": post_id,
        "slice": i % 16,
        "content_hash": "c" * 64,
        "label": "ok",
        "rule_ids": "",
        "confidence": 0.5 + i / 1000,
        "p_label": None,
        "raw_result": None,
        "mapping": None,
        "stage": None,
        "model": "m",
        "key_version": "p",
        "task_version": "t",
        "run_id": "run",
        "created_at": utcnow(),
    }


def test_inserts_with_on_conflict_keep_every_value_and_the_clause(store_url: str) -> None:
    # On PostgreSQL these go through a COPY into a staging table and one INSERT ... SELECT:
    # hostile text arrives exactly, a key already there is left alone (DO NOTHING) or updated
    # (the dead letters' upsert), and a second flush in the same transaction starts empty.
    engine = engine_for(store_url)
    first = [_result(i, HOSTILE[i % len(HOSTILE)] or "p") for i in range(20)]
    again = [_result(i, "changed") for i in range(10, 30)]
    dead = [
        {
            **_result(i, "p"),
            "outcome": "retry_exhausted",
            "reason": h,
            "attempts": 3,
            "at": utcnow(),
        }
        for i, h in enumerate(HOSTILE)
    ]
    later = [{**d, "reason": "later", "attempts": 4} for d in dead[:2]]
    with engine.begin() as conn:  # one transaction, as a writer's flush is
        insert_rows(conn, results, RESULT_COLUMNS, first, "ON CONFLICT DO NOTHING")
        insert_rows(conn, results, RESULT_COLUMNS, again, "ON CONFLICT DO NOTHING")
        insert_rows(conn, dead_letters, DEAD_COLUMNS, dead, DEAD_UPSERT)
        insert_rows(conn, dead_letters, DEAD_COLUMNS, later, DEAD_UPSERT)
    if engine.dialect.name == "postgresql":
        # Outside a transaction (autocommit) a staging table would be emptied between the
        # COPY and the INSERT: such a caller gets the plain multi-row INSERT instead.
        raw = engine.raw_connection()
        try:
            raw.driver_connection.autocommit = True
            extra = [_result(i, "auto") for i in range(30, 35)]
            insert_rows(
                raw.driver_connection, results, RESULT_COLUMNS, extra, "ON CONFLICT DO NOTHING"
            )
        finally:
            raw.driver_connection.autocommit = False
            raw.close()
    with engine.connect() as conn:
        got = dict(conn.execute(sa.select(results.c.key, results.c.post_id)).all())
        reasons = dict(conn.execute(sa.select(dead_letters.c.key, dead_letters.c.reason)).all())
    assert len(got) == (35 if engine.dialect.name == "postgresql" else 30)
    assert [got[r["key"]] for r in first] == [r["post_id"] for r in first]  # kept
    assert [got[r["key"]] for r in again[10:]] == ["changed"] * 10  # new keys added
    assert [reasons[d["key"]] for d in dead] == ["later", "later", *HOSTILE[2:]]
