"""applied_labels: keyed, idempotent, and only for partitions whose blocking checks pass."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from sqlalchemy.engine import Engine

from backfill_assets.definitions import APPLY_JOB, build_definitions
from backfill_assets.ledger.labels.apply import apply_partitions
from backfill_assets.runner.orchestrate import materialize
from backfill_tests.conftest import import_records
from backfill_tests.moderation_helpers import (
    busiest,
    dump_posts,
    execute,
    load,
    one_key,
    run_job,
)
from backfill_tests.pipeline_helpers import RUBRIC, VERSIONS, count, run

ACME = "acme"


@pytest.fixture
def instance(tmp_path: Path) -> dg.DagsterInstance:
    return dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))


def shadow_labels(engine: Engine, tenant: str = ACME) -> int:
    return count(
        engine,
        f"SELECT count(*) FROM posts WHERE tenant_id = '{tenant}'"
        " AND moderation_label_shadow IS NOT NULL",
    )


def test_replaying_apply_leaves_posts_byte_identical(
    engine: Engine, store_url: str, tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    load(engine, tmp_path, {ACME: 80}, spam_every=7)
    (first,) = run_job(store_url, instance, [ACME])
    assert first.success and len(first.applied) == 16
    after_first = dump_posts(engine)
    assert shadow_labels(engine) == 80
    assert count(engine, "SELECT count(*) FROM posts WHERE moderation_label IS NOT NULL") == 0
    for _ in range(2):
        (again,) = run_job(store_url, instance, [ACME])
        assert again.success and len(again.applied) == 16
        assert all(again.metadata[pk]["model_calls"] == 0 for pk in again.partitions)
        assert dump_posts(engine) == after_first
    # Directly, too: the second write of the same labels changes no row.
    ref = busiest(engine, ACME)
    with engine.begin() as conn:
        (rep,) = apply_partitions(conn, [(ACME, ref.slices)], VERSIONS, RUBRIC.policy)
    assert rep.changed == 0 and rep.eligible == rep.unchanged > 0


@pytest.mark.parametrize(
    ("tamper", "env", "check"),
    [
        ("UPDATE results SET tenant_id = 'globex' WHERE key = :k", {}, "isolation"),
        # A budget of 1 token defers every call of the re-run, so the deleted key stays missing.
        ("DELETE FROM results WHERE key = :k", {"BACKFILL_TENANT_BUDGET_TOKENS": "1"}, "coverage"),
    ],
    ids=["isolation", "coverage"],
)
def test_blocking_check_keeps_apply_out_of_the_run(
    engine: Engine,
    store_url: str,
    tmp_path: Path,
    instance: dg.DagsterInstance,
    tamper: str,
    env: dict[str, str],
    check: str,
) -> None:
    load(engine, tmp_path, {ACME: 80, "globex": 10})
    run(engine, [ACME, "globex"])  # labels exist, nothing applied yet
    ref = busiest(engine, ACME)
    execute(engine, tamper, k=one_key(engine, ref))
    before = dump_posts(engine)
    records = run_job(store_url, instance, [ACME], [f"s{ref.slice:02d}"], **env)
    assert len(records) == 1  # nothing clean left to apply in a one-partition run
    (main,) = records
    assert not main.success and main.applied == []
    assert main.blocked() == {ref.key: [check]}
    assert dump_posts(engine) == before


def test_clean_partitions_of_a_blocked_range_are_applied_in_a_follow_up(
    engine: Engine, store_url: str, tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    load(engine, tmp_path, {ACME: 80})
    run(engine, [ACME])
    ref = busiest(engine, ACME)
    execute(engine, "UPDATE results SET label = 'nsfw' WHERE key = :k", k=one_key(engine, ref))
    records = run_job(store_url, instance, [ACME])
    main, follow_ups = records[0], records[1:]
    assert not main.success and list(main.blocked()) == [ref.key]
    assert follow_ups and all(r.job == APPLY_JOB and r.success for r in follow_ups)
    applied = {pk for r in follow_ups for pk in r.applied}
    assert applied == set(main.partitions) - {ref.key}
    in_blocked = count(
        engine,
        f"SELECT count(*) FROM posts WHERE tenant_id = 'acme' AND slice = {ref.slice}"
        " AND moderation_label_shadow IS NOT NULL",
    )
    assert in_blocked == 0 and shadow_labels(engine) > 0


def test_apply_job_alone_re_checks_and_refuses(
    engine: Engine, store_url: str, tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    load(engine, tmp_path, {ACME: 40})
    run(engine, [ACME])
    ref = busiest(engine, ACME)
    execute(
        engine, "UPDATE results SET tenant_id = 'globex' WHERE key = :k", k=one_key(engine, ref)
    )
    defs = build_definitions({"BACKFILL_DATABASE_URL": store_url})
    # applied_labels on its own has no checks in its run; it runs them itself.
    (rec,) = materialize(
        defs, instance, APPLY_JOB, [ACME], [f"s{ref.slice:02d}"], log_level="CRITICAL"
    )
    assert not rec.success and rec.applied == []
    assert rec.error is not None
    assert shadow_labels(engine) == 0


def test_live_switch_writes_the_live_column_too(
    engine: Engine, store_url: str, tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    load(engine, tmp_path, {ACME: 30})
    (rec,) = run_job(store_url, instance, [ACME], BACKFILL_APPLY_LIVE="1")
    assert rec.success
    assert (
        count(
            engine,
            "SELECT count(*) FROM posts WHERE moderation_label = moderation_label_shadow"
            " AND moderation_rubric_version = moderation_rubric_version_shadow",
        )
        == 30
    )
    md = [m for m in rec.metadata.values()]
    assert md and all("task_version" in m for m in md)


def test_a_label_for_an_edited_post_is_not_applied(engine: Engine, tmp_path: Path) -> None:
    import_records(engine, tmp_path, [{"tenant_id": ACME, "post_id": "p1", "text": "first text"}])
    run(engine, [ACME])
    import_records(
        engine, tmp_path, [{"tenant_id": ACME, "post_id": "p1", "text": "edited"}], name="b.jsonl"
    )
    ref = busiest(engine, ACME)
    with engine.begin() as conn:
        (rep,) = apply_partitions(conn, [(ACME, ref.slices)], VERSIONS, RUBRIC.policy)
    # The only result is for the old text: applying it to the new text would be wrong.
    assert rep.eligible == 0 and rep.changed == 0
    assert shadow_labels(engine) == 0


def test_a_group_applies_exactly_its_partitions_and_counts_each(
    engine: Engine, tmp_path: Path
) -> None:
    # One transaction and one statement per step for many partitions: each partition's counts
    # are its own, and a slice no partition of the group holds is not written.
    load(engine, tmp_path, {ACME: 80, "globex": 40, "initech": 30}, spam_every=7)
    run(engine, [ACME, "globex", "initech"])
    low, high = tuple(range(8)), tuple(range(8, 16))
    with engine.begin() as conn:
        reps = apply_partitions(
            conn, [(ACME, low), ("globex", low + high), ("initech", high)], VERSIONS, RUBRIC.policy
        )
    posts_in = {
        name: count(
            engine,
            f"SELECT count(*) FROM posts WHERE tenant_id = '{tenant}'"
            f" AND slice IN ({', '.join(map(str, slices))})",
        )
        for name, tenant, slices in (
            ("a", ACME, low),
            ("g", "globex", low + high),
            ("i", "initech", high),
        )
    }
    assert [(r.eligible, r.changed) for r in reps] == [(n, n) for n in posts_in.values()]
    assert shadow_labels(engine) == posts_in["a"] < 80  # acme's high slices were not in it
    assert shadow_labels(engine, "initech") == posts_in["i"] < 30
    # Two partitions of one tenant in a group: each written post is counted by its slice.
    with engine.begin() as conn:
        again = apply_partitions(conn, [(ACME, low), (ACME, high)], VERSIONS, RUBRIC.policy)
    rest = 80 - posts_in["a"]
    assert [(r.eligible, r.changed) for r in again] == [(posts_in["a"], 0), (rest, rest)]
    assert shadow_labels(engine) == 80
