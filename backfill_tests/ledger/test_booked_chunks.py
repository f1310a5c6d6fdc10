"""sql/019 renames a batch chunk's final state 'applied' to 'booked' (and applied_at to
booked_at) in a store that already holds chunks, on both stores: every row and its lines kept,
the new CHECK enforced, batch_lines still bound to its chunks."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from backfill_assets.ledger.dead_peer import DeadPeer
from backfill_assets.ledger.engine import make_engine
from backfill_assets.ledger.migrate import SQL_DIR, migrate, schema_versions

_CHUNK = (
    "INSERT INTO batch_submissions (chunk_id, chunk_base, seq, tenant_id, slice, model,"
    " prompt_version, task_version, lines, file_sha256, file_bytes, state, run_id, intent_at,"
    " {at}) VALUES (:id, :id, 0, 'acme', 0, 'm', 'p', 't', 1, 'h', 1, :state, 'r',"
    " '2026-12-01 10:00:00', :at)"
)
_LINE = (
    "INSERT INTO batch_lines (chunk_id, line_no, key, tenant_id, slice, post_id, content_hash,"
    " attempt_no) VALUES (:id, 0, :id, 'acme', 0, 'p1', 'h', 1)"
)


def test_a_store_with_applied_chunks_migrates_to_booked(store_url: str, tmp_path: Path) -> None:
    # The migrations before sql/019, and through it (later ones are not this test's).
    before, through = tmp_path / "sql", tmp_path / "sql-019"
    before.mkdir()
    through.mkdir()
    for path in SQL_DIR.iterdir():
        if path.name.endswith(".sql") and int(path.name[:3]) <= 19:
            for folder in (before, through) if int(path.name[:3]) < 19 else (through,):
                (folder / path.name).write_text(path.read_text("utf-8"), "utf-8")
    engine = make_engine(store_url, DeadPeer())
    try:
        migrate(engine, before)
        with engine.begin() as conn:
            for chunk, state in (("c1", "applied"), ("c2", "submitted"), ("c3", "failed")):
                at = "2026-12-01 11:00:00" if state == "applied" else None
                conn.execute(
                    sa.text(_CHUNK.format(at="applied_at")), {"id": chunk, "state": state, "at": at}
                )
                conn.execute(sa.text(_LINE), {"id": chunk})
        assert migrate(engine, through) == [19]
        with engine.connect() as conn:
            assert schema_versions(conn)[-1] == 19
            rows = conn.execute(
                sa.text("SELECT chunk_id, state, booked_at FROM batch_submissions ORDER BY 1")
            ).all()
            lines = conn.execute(sa.text("SELECT count(*) FROM batch_lines")).scalar_one()
        assert [(c, s) for c, s, _at in rows] == [
            ("c1", "booked"),
            ("c2", "submitted"),
            ("c3", "failed"),
        ]
        assert str(rows[0][2]).startswith("2026-12-01 11:00:00") and rows[1][2] is None
        assert lines == 3
        with engine.begin() as conn:  # the new state is allowed
            conn.execute(
                sa.text(_CHUNK.format(at="booked_at")), {"id": "c4", "state": "booked", "at": None}
            )
        for sql, params in (
            (_CHUNK.format(at="booked_at"), {"id": "c5", "state": "applied", "at": None}),
            (_LINE, {"id": "no-such-chunk"}),  # batch_lines still references batch_submissions
        ):
            with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
                conn.execute(sa.text(sql), params)
        assert migrate(engine, through) == []
    finally:
        engine.dispose()
