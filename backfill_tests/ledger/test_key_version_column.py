"""sql/021 renames ``prompt_version`` to ``key_version`` in the four run-path tables of a store
that already holds rows, on both stores: every row kept with its value, and the unique index
over a post's versions still enforced under the new name."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from backfill_assets.ledger.dead_peer import DeadPeer
from backfill_assets.ledger.engine import make_engine
from backfill_assets.ledger.migrate import SQL_DIR, migrate, schema_versions

_RESULT = (
    "INSERT INTO results (key, tenant_id, post_id, slice, content_hash, label, confidence, model,"
    " {column}, task_version, run_id, created_at) VALUES (:key, 'acme', :post, 0, 'h', 'ok',"
    " 0.9, 'm', :v, 't', 'r', '2026-12-01 10:00:00')"
)
_EVENT = (
    "INSERT INTO ledger_events (tenant_id, key, attempt_id, attempt_no, type, slice, model,"
    " {column}, run_id, at) VALUES ('acme', 'k1', 'a1', 1, 'attempt', 0, 'm', :v, 'r',"
    " '2026-12-01 10:00:00')"
)
_DEAD = (
    "INSERT INTO dead_letters (key, tenant_id, post_id, slice, content_hash, model, {column},"
    " task_version, outcome, reason, attempts, run_id, at) VALUES ('k9', 'acme', 'p9', 0, 'h',"
    " 'm', :v, 't', 'retry_exhausted', 'x', 3, 'r', '2026-12-01 10:00:00')"
)
_CHUNK = (
    "INSERT INTO batch_submissions (chunk_id, chunk_base, seq, tenant_id, slice, model, {column},"
    " task_version, lines, file_sha256, file_bytes, state, run_id, intent_at) VALUES ('c1', 'c1',"
    " 0, 'acme', 0, 'm', :v, 't', 1, 'h', 1, 'intent', 'r', '2026-12-01 10:00:00')"
)
_TABLES = ("results", "ledger_events", "dead_letters", "batch_submissions")


def test_a_store_with_rows_renames_prompt_version_to_key_version(
    store_url: str, tmp_path: Path
) -> None:
    # The migrations before sql/021, and through it (later ones are not this test's).
    before, through = tmp_path / "sql", tmp_path / "sql-021"
    before.mkdir()
    through.mkdir()
    for path in SQL_DIR.iterdir():
        if path.name.endswith(".sql") and int(path.name[:3]) <= 21:
            for folder in (before, through) if int(path.name[:3]) < 21 else (through,):
                (folder / path.name).write_text(path.read_text("utf-8"), "utf-8")
    old = "prompt_version"  # the retired name, which this migration retires
    engine = make_engine(store_url, DeadPeer())
    try:
        migrate(engine, before)
        with engine.begin() as conn:
            conn.execute(
                sa.text(_RESULT.format(column=old)), {"key": "k1", "post": "p1", "v": "a@1"}
            )
            for sql in (_EVENT, _DEAD, _CHUNK):
                conn.execute(sa.text(sql.format(column=old)), {"v": "a@1"})
        assert migrate(engine, through) == [21]
        columns = {t: {c["name"] for c in sa.inspect(engine).get_columns(t)} for t in _TABLES}
        assert all("key_version" in c and old not in c for c in columns.values()), columns
        with engine.connect() as conn:
            assert schema_versions(conn)[-1] == 21
            kept = [
                conn.execute(sa.text(f"SELECT key_version FROM {t}")).scalars().all()
                for t in _TABLES
            ]
        assert kept == [["a@1"]] * 4
        # results_by_post names the column under its new name: one result per post and versions.
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.execute(
                sa.text(_RESULT.format(column="key_version")),
                {"key": "k2", "post": "p1", "v": "a@1"},
            )
        with engine.begin() as conn:
            conn.execute(
                sa.text(_RESULT.format(column="key_version")),
                {"key": "k3", "post": "p1", "v": "a@2"},
            )
        assert migrate(engine, through) == []
    finally:
        engine.dispose()
