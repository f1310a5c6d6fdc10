"""Moderators' decisions outrank the model in ``applied_labels`` (issue 50, item 2 and 5):
re-applies, a newer version that keeps or drops the decision's label, an edited post, and
isolation of decisions between tenants."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.domain.policy.document import Policy, PolicyDoc
from backfill_assets.domain.work.keys import Versions
from backfill_assets.ledger.decisions.precedence import apply_decisions
from backfill_assets.ledger.labels.apply import apply_partitions
from backfill_assets.ledger.policies import register
from backfill_tests.decision_helpers import record_decision
from backfill_tests.moderation_helpers import busiest, check_results, execute, load, run_job
from backfill_tests.pipeline_helpers import RUBRIC, VERSIONS

ACME = "acme"


@pytest.fixture
def instance(tmp_path: Path) -> dg.DagsterInstance:
    return dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))


def decide(
    engine: Engine,
    tenant: str,
    post: str,
    label: str,
    *,
    policy: Policy = RUBRIC.policy,
    rules: str = "",
    at: dt.datetime = dt.datetime(2026, 11, 1, 12, 0),
    reviewer: str = "r-17",
) -> dict[str, int]:
    """Record one decision as an import does (its policy version registered, as the import
    finds it) and apply it; what the apply did."""
    with engine.begin() as conn:
        register(conn, policy)
    done = record_decision(
        engine, tenant, post, label, policy=policy, rules=rules, at=at, reviewer=reviewer
    )
    return vars(done)


def in_force(engine: Engine, tenant: str, post: str) -> tuple[str, str, str]:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT label, source, policy_version FROM applied_labels"
                " WHERE tenant_id = :t AND post_id = :p"
            ),
            {"t": tenant, "p": post},
        ).one()
    return (str(row[0]), str(row[1]), str(row[2]))


def labelled(engine: Engine, store_url: str, tmp_path: Path, inst: dg.DagsterInstance) -> str:
    """A labelled, applied store; a post of acme whose model label is ``ok``."""
    load(engine, tmp_path, {ACME: 40, "globex": 10}, spam_every=7)
    assert all(rec.success for rec in run_job(store_url, inst, [ACME, "globex"]))
    with engine.connect() as conn:
        post = conn.execute(
            sa.text(
                "SELECT post_id FROM applied_labels WHERE tenant_id = 'acme' AND label = 'ok'"
                " ORDER BY post_id LIMIT 1"
            )
        ).scalar_one()
    return str(post)


def newer_policy(labels: list[str]) -> Policy:
    """Version 2 of the policy in force, with only ``labels`` (and their rules) kept."""
    doc = RUBRIC.policy.doc.model_dump()
    doc["version"] = "2"
    doc["labels"] = [lb for lb in doc["labels"] if lb["id"] in labels]
    doc["rules"] = [r for r in doc["rules"] if r["label"] in labels]
    return Policy(PolicyDoc.model_validate(doc))


def test_a_decision_outranks_the_model_whatever_reapplies(
    engine: Engine, store_url: str, tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    post = labelled(engine, store_url, tmp_path, instance)
    assert in_force(engine, ACME, post)[:2] == ("ok", "model")
    done = decide(engine, ACME, post, "spam")
    assert done["applied"] == 1 and in_force(engine, ACME, post)[:2] == ("spam", "human")
    # Applying the same decisions again writes nothing.
    assert decide_again(engine, post)["unchanged"] == 1
    # A rerun (and --force: every partition re-applied) leaves the decision in force.
    for _ in range(2):
        assert all(rec.success for rec in run_job(store_url, instance, [ACME]))
    assert in_force(engine, ACME, post)[:2] == ("spam", "human")
    ref = busiest(engine, ACME)
    with engine.begin() as conn:
        slices = [s for (s,) in conn.execute(sa.text("SELECT DISTINCT slice FROM posts"))]
        reps = apply_partitions(conn, [(ACME, slices)], VERSIONS, RUBRIC.policy)
    assert sum(r.human_kept for r in reps) == 1 and sum(r.changed for r in reps) == 0
    assert in_force(engine, ACME, post)[:2] == ("spam", "human")
    # The newest decision wins.
    decide(engine, ACME, post, "abuse", at=dt.datetime(2026, 11, 2), reviewer="r-2")
    assert in_force(engine, ACME, post)[:2] == ("abuse", "human")
    # The partition's checks pass: a decision is no isolation problem.
    assert check_results(engine, ref)["isolation"].passed


def decide_again(engine: Engine, post: str) -> dict[str, int]:
    with engine.begin() as conn:
        return vars(apply_decisions(conn, [(ACME, post, RUBRIC.policy.policy_id)]))


def _apply_version(engine: Engine, policy: Policy) -> None:
    versions = Versions(VERSIONS.task_version, policy.key_version, VERSIONS.model)
    with engine.begin() as conn:
        # The new version's results: the model's labels under it, as a run would store them.
        conn.execute(
            sa.text(
                "INSERT INTO results (key, tenant_id, post_id, slice, content_hash, model,"
                " task_version, key_version, label, rule_ids, confidence, created_at, run_id)"
                " SELECT key || '-v2', tenant_id, post_id, slice, content_hash, model,"
                " task_version, :kv, 'ok', '', confidence, created_at, run_id"
                " FROM results WHERE key_version = :old"
            ),
            {"kv": policy.key_version, "old": VERSIONS.key_version},
        )
        slices = [s for (s,) in conn.execute(sa.text("SELECT DISTINCT slice FROM posts"))]
        apply_partitions(conn, [(ACME, slices)], versions, policy)


def test_a_newer_version_keeps_a_decision_whose_label_it_has(
    engine: Engine, store_url: str, tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    post = labelled(engine, store_url, tmp_path, instance)
    decide(engine, ACME, post, "spam")
    _apply_version(engine, newer_policy(["ok", "spam", "abuse", "needs_review"]))
    assert in_force(engine, ACME, post) == ("spam", "human", RUBRIC.policy.version)


def test_a_newer_version_without_the_label_sends_the_post_back_to_review(
    engine: Engine, store_url: str, tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    post = labelled(engine, store_url, tmp_path, instance)
    decide(engine, ACME, post, "spam")
    v2 = newer_policy(["ok", "abuse", "needs_review"])
    _apply_version(engine, v2)
    assert in_force(engine, ACME, post) == ("ok", "model", "2")
    # Re-applying the old decision does not take the post back from the newer version.
    assert decide_again(engine, post)["held_for_review"] == 1
    assert in_force(engine, ACME, post)[1] == "model"
    # A decision under the new version settles it.
    decide(engine, ACME, post, "abuse", policy=v2, at=dt.datetime(2026, 12, 1))
    assert in_force(engine, ACME, post) == ("abuse", "human", "2")


def test_an_edited_post_is_the_models_again(
    engine: Engine, store_url: str, tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    post = labelled(engine, store_url, tmp_path, instance)
    decide(engine, ACME, post, "spam")
    execute(
        engine,
        "UPDATE posts SET content_hash = 'edited', text = 'new text' WHERE post_id = :p"
        " AND tenant_id = 'acme'",
        p=post,
    )
    assert decide_again(engine, post)["stale_text"] == 1


def test_a_decision_never_reaches_another_tenants_post(
    engine: Engine, store_url: str, tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    post = labelled(engine, store_url, tmp_path, instance)
    decide(engine, ACME, post, "spam")
    with engine.connect() as conn:
        globex_before = conn.execute(
            sa.text("SELECT * FROM applied_labels WHERE tenant_id = 'globex' ORDER BY post_id")
        ).all()
    assert all(r.source == "model" for r in globex_before)
    # Tampering: globex's label in force points at acme's decision. Isolation fails.
    with engine.begin() as conn:
        key = conn.execute(sa.text("SELECT decision_key FROM decisions")).scalar_one()
        victim = globex_before[0].post_id
        conn.execute(
            sa.text(
                "UPDATE applied_labels SET source = 'human', result_key = :k, label = 'spam'"
                " WHERE tenant_id = 'globex' AND post_id = :p"
            ),
            {"k": key, "p": victim},
        )
        slice_no = conn.execute(
            sa.text("SELECT slice FROM posts WHERE tenant_id = 'globex' AND post_id = :p"),
            {"p": victim},
        ).scalar_one()
    from backfill_assets.dispatch.pipeline import PartitionRef

    ref = PartitionRef(f"s{slice_no:02d}|globex", "globex", int(slice_no))
    iso = check_results(engine, ref)["isolation"]
    assert not iso.passed and any("decision about acme/" in k for k in iso.sample_keys)
