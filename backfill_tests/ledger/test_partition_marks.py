"""Partition marks on both stores: a mark, a re-mark, a clear of some, a partition given twice.

PostgreSQL writes a run's marks as one statement over arrays and SQLite as an executemany; both
must leave the same rows."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from backfill_assets.ledger.engine import write_tx
from backfill_assets.ledger.run.partition_marks import clear, mark, marked


def test_marks_are_set_replaced_and_cleared(engine: Engine) -> None:
    first = [(f"t{i:04d}", i % 3, 0) for i in range(1_200)]
    with write_tx(engine) as conn:
        mark(conn, first, "v1")
    with engine.connect() as conn:
        assert marked(conn, "v1") == set(first)

    # Marked again at a new version and level, one partition listed twice (the last wins, as
    # an executemany of the two would leave it), another tenant's partition added.
    again = [("t0001", 1, 2), ("t0001", 1, 3), ("t0002", 2, 1), ("zz", 7, 4)]
    with write_tx(engine) as conn:
        mark(conn, again, "v2")
    with engine.connect() as conn:
        assert marked(conn, "v2") == {("t0001", 1, 3), ("t0002", 2, 1), ("zz", 7, 4)}
        assert marked(conn, "v1") == set(first) - {("t0001", 1, 0), ("t0002", 2, 0)}
        assert marked(conn, "v2", ["zz", "t0001"]) == {("t0001", 1, 3), ("zz", 7, 4)}

    # Cleared: only the partitions named (tenant and number both match), whatever the level.
    with write_tx(engine) as conn:
        clear(conn, [("t0001", 1, 0), ("t0003", 1, 0), ("zz", 7, 4), ("t0004", 5, 0)])
        clear(conn, [])
        mark(conn, [], "v3")
    with engine.connect() as conn:
        assert marked(conn, "v2") == {("t0002", 2, 1)}
        assert ("t0003", 0, 0) in marked(conn, "v1")
        assert ("t0004", 1, 0) in marked(conn, "v1")
        assert len(marked(conn, "v1")) == len(first) - 2
