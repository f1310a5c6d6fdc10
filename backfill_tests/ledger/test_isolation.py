"""Isolation recomputes a row's slice and key from the posts, not from the row's own columns.

Before: ``verify`` ignored the slice column, and a row's key was recomputed from the row's own
``content_hash``, so a result whose hash and key were rewritten together passed isolation.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.dispatch.pipeline import PartitionRef
from backfill_assets.domain.work.keys import content_hash, slice_of, work_key
from backfill_tests.conftest import import_records
from backfill_tests.moderation_helpers import busiest, check_results, execute, load, one_key
from backfill_tests.pipeline_helpers import VERSIONS, run, verify

ACME = "acme"


def failed(engine: Engine, ref: PartitionRef) -> set[str]:
    return {name for name, v in check_results(engine, ref).items() if not v.passed}


def isolation_problems(engine: Engine) -> list[dict[str, str]]:
    doc = verify(engine).as_dict()
    return [p for p in doc["problems"] if p["kind"] == "isolation"]


def ref_of(tenant: str, slice_no: int) -> PartitionRef:
    return PartitionRef(f"s{slice_no:02d}|{tenant}", tenant, slice_no)


def labelled(engine: Engine, tmp_path: Path) -> PartitionRef:
    load(engine, tmp_path, {ACME: 80, "globex": 20})
    run(engine, [ACME, "globex"])
    ref = busiest(engine, ACME)
    assert failed(engine, ref) == set() and verify(engine).as_dict()["ok"]
    return ref


def test_a_result_moved_to_another_slice_fails_isolation(engine: Engine, tmp_path: Path) -> None:
    ref = labelled(engine, tmp_path)
    key = one_key(engine, ref)
    other = (ref.slice + 1) % 16
    execute(engine, "UPDATE results SET slice = :s WHERE key = :k", s=other, k=key)
    # verify (tenant scope) now sees the slice...
    (problem,) = isolation_problems(engine)
    assert problem["key"] == key and "its post belongs to slice" in problem["detail"]
    assert not verify(engine).as_dict()["ok"]
    # ... and so do both partitions: the one it claims and the one its key belongs to.
    assert "isolation" in failed(engine, ref_of(ACME, other))
    assert "isolation" in failed(engine, ref)


def test_a_rewritten_content_hash_fails_isolation(engine: Engine, tmp_path: Path) -> None:
    ref = labelled(engine, tmp_path)
    key = one_key(engine, ref)
    with engine.connect() as conn:
        found = conn.execute(sa.text("SELECT post_id FROM results WHERE key = :k"), {"k": key})
        post_id = str(found.scalar_one())
    # The row is made self-consistent: its key recomputes from its own columns.
    forged_hash = content_hash("a text this post never had")
    forged_key = work_key(VERSIONS, ACME, post_id, forged_hash)
    execute(
        engine,
        "UPDATE results SET content_hash = :h, key = :nk WHERE key = :k",
        h=forged_hash,
        nk=forged_key,
        k=key,
    )
    (problem,) = isolation_problems(engine)
    assert problem["key"] == forged_key
    assert "no attempt of this tenant sent it" in problem["detail"]
    assert {"isolation", "coverage"} <= failed(engine, ref)


def test_a_result_for_an_edited_posts_older_text_is_stale_not_foreign(
    engine: Engine, tmp_path: Path
) -> None:
    import_records(
        engine,
        tmp_path,
        [
            {"tenant_id": ACME, "post_id": "edited", "text": "first version, buy now"},
            {"tenant_id": ACME, "post_id": "other", "text": "unchanged"},
        ],
    )
    run(engine, [ACME])
    import_records(
        engine,
        tmp_path,
        [{"tenant_id": ACME, "post_id": "edited", "text": "second version, fine"}],
        name="edit.jsonl",
    )
    ref = ref_of(ACME, slice_of(ACME, "edited"))
    # Edited, not yet re-run: the old result is stale (not done), and nothing is foreign.
    doc = verify(engine).as_dict(require_complete=True)
    (tenant,) = doc["tenants"]
    assert (tenant["stale"], tenant["missing"], tenant["done"]) == (1, 1, 1)
    assert isolation_problems(engine) == []
    assert failed(engine, ref) == {"coverage"}
    assert check_results(engine, ref)["coverage"].counts["stale"] == 1
    # The next run labels the new text; the stale row stays, honestly reported.
    run(engine, [ACME])
    doc = verify(engine).as_dict(require_complete=True)
    assert doc["ok"] and doc["tenants"][0]["stale"] == 1 and doc["tenants"][0]["done"] == 2
    assert failed(engine, ref) == set()
