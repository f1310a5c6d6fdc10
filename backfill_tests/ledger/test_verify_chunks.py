"""``verify`` reads a tenant a chunk of posts at a time: the same findings as reading it whole,
with memory bounded by the chunk (whole, the largest tenant cost about 6.3 KB a post)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

import backfill_assets.runner.verify as verify_module
from backfill_assets.domain.work.keys import content_hash
from backfill_assets.ledger.evidence.evidence import tenant_chunks
from backfill_assets.ledger.tables import ledger_events
from backfill_assets.runner.verify import verify_store
from backfill_tests.conftest import import_records
from backfill_tests.moderation_helpers import execute
from backfill_tests.pipeline_helpers import VERSIONS, run

ACME = "acme"
# Upper, lower, digits, punctuation and multi-byte ids: their order differs between byte order
# and a language's collation, and the merge compares them in Python.
IDS = ["p01", "P02", "é03", "Z04", "_05", "a06", "10", "9", "ß08", "~09", "日10", "Ab11"]


def _tampered(engine: Engine, tmp_path: Path) -> None:
    recs = [
        {"tenant_id": ACME, "post_id": f"{pid}-{i}", "text": f"post {pid} number {i}"}
        for i in range(5)
        for pid in IDS
    ]
    recs += [{"tenant_id": "globex", "post_id": f"g{i}", "text": f"globex {i}"} for i in range(9)]
    import_records(engine, tmp_path, recs, name="chunks.jsonl")
    run(engine, [ACME, "globex"])
    cols = [c.name for c in ledger_events.columns if c.name != "id"]
    listed = ", ".join(cols)
    # An edited post: its result is stale and its current key is missing.
    execute(
        engine,
        "UPDATE posts SET content_hash = :h WHERE tenant_id = :t AND post_id = :p",
        h=content_hash("edited"),
        t=ACME,
        p="Z04-2",
    )
    # An attempt whose answer is lost (an orphan) ...
    execute(
        engine,
        "DELETE FROM ledger_events WHERE id = (SELECT max(id) FROM ledger_events"
        " WHERE type = 'usage' AND tenant_id = :t)",
        t=ACME,
    )
    # ... a usage event booked twice (re-billed tokens) ...
    execute(
        engine,
        f"INSERT INTO ledger_events ({listed}) SELECT {listed} FROM ledger_events"
        " WHERE id = (SELECT min(id) FROM ledger_events WHERE type = 'usage' AND tenant_id = :t)",
        t=ACME,
    )
    # ... an event that names no post and no attempt of the tenant ...
    execute(
        engine,
        f"INSERT INTO ledger_events ({listed}) SELECT {listed} FROM ledger_events"
        " WHERE id = (SELECT min(id) FROM ledger_events WHERE type = 'usage' AND tenant_id = :t)",
        t="globex",
    )
    execute(
        engine,
        "UPDATE ledger_events SET tenant_id = :t, attempt_id = 'forged'"
        " WHERE id = (SELECT max(id) FROM ledger_events)",
        t=ACME,
    )
    # ... and a result filed in another slice.
    execute(
        engine,
        "UPDATE results SET slice = (slice + 1) % 16 WHERE key ="
        " (SELECT min(key) FROM results WHERE tenant_id = :t)",
        t=ACME,
    )


def _sorted(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "problems": sorted(doc["problems"], key=lambda p: sorted(p.items()))}


def test_a_tenant_read_in_chunks_gives_what_reading_it_whole_gives(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tampered(engine, tmp_path)
    whole = verify_store(engine, VERSIONS, chunk_posts=10**9).as_dict(require_complete=True)
    acme = next(t for t in whole["tenants"] if t["tenant"] == ACME)
    assert acme["stale"] == 1 and acme["missing"] == 1 and acme["orphan_attempts"] == 1
    assert acme["rebilled_tokens"] > 0
    details = {p["detail"] for p in whole["problems"]}
    assert "event without an attempt of this tenant" in details
    assert any("its post belongs to slice" in d for d in details)

    seen: list[int] = []
    scope = verify_module.verify_scope

    def spy(tenant: str, posts: dict[str, str], *args: Any, **kw: Any) -> Any:
        seen.append(len(posts))
        return scope(tenant, posts, *args, **kw)

    monkeypatch.setattr(verify_module, "verify_scope", spy)
    chunked = verify_store(engine, VERSIONS, chunk_posts=3).as_dict(require_complete=True)
    assert _sorted(chunked) == _sorted(whole)
    # 60 + 9 posts, three at a time, and the event that names no post on its own.
    assert max(seen) == 3 and len(seen) >= 60 // 3 + 9 // 3 + 1


def test_the_chunks_follow_post_id_order_in_bytes(engine: Engine, tmp_path: Path) -> None:
    recs = [{"tenant_id": ACME, "post_id": pid, "text": f"text of {pid}"} for pid in IDS]
    import_records(engine, tmp_path, recs, name="ids.jsonl")
    run(engine, [ACME])
    with engine.connect() as conn:
        chunks = list(tenant_chunks(conn, ACME, chunk_posts=1))
    assert [next(iter(c.posts)) for c in chunks] == sorted(IDS)
    # Every chunk holds its post's result and its attempt and usage, nothing of another post.
    for chunk in chunks:
        (pid,) = chunk.posts
        assert [r["post_id"] for r in chunk.results] == [pid]
        assert sorted(str(e["type"]) for e in chunk.ledger) == ["attempt", "usage"]
    with engine.connect() as conn:
        total = conn.execute(sa.text("SELECT count(*) FROM ledger_events")).scalar_one()
    assert sum(len(c.ledger) for c in chunks) == total
