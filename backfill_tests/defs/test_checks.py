"""The seven partition checks: each passes on a clean backfill and fails on its own fault."""

from __future__ import annotations

import uuid
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.config.settings import Settings, SettingsError
from backfill_assets.domain.checks.catalog import CHECK_NAMES
from backfill_assets.domain.checks.drift_baseline import parse_baseline
from backfill_assets.domain.checks.rules import DriftRule, drifted_labels
from backfill_tests.moderation_helpers import (
    busiest,
    check_results,
    execute,
    load,
    one_key,
    run_job,
)
from backfill_tests.pipeline_helpers import run

ACME = "acme"


@pytest.fixture
def labelled(engine: Engine, tmp_path: Path) -> Engine:
    """Two tenants, labelled by the pipeline (no Dagster), every check green."""
    load(engine, tmp_path, {ACME: 120, "globex": 40}, spam_every=10)
    run(engine, [ACME, "globex"])
    return engine


def failed(found: dict[str, object]) -> set[str]:
    return {n for n, v in found.items() if not v.passed}  # type: ignore[attr-defined]


def test_clean_partition_passes_every_check(labelled: Engine) -> None:
    found = check_results(labelled, busiest(labelled, ACME))
    assert list(found) == list(CHECK_NAMES)
    assert failed(found) == set()
    cov = found["coverage"]
    assert cov.counts["expected"] == cov.counts["accepted"] > 0 and cov.counts["missing"] == 0
    assert found["spend"].counts["billed_tokens"] > 0
    assert found["isolation"].inspect.startswith("backfill-moderation check --tenant acme")


def test_isolation_fails_on_a_row_relabelled_to_another_tenant(labelled: Engine) -> None:
    ref = busiest(labelled, ACME)
    key = one_key(labelled, ref)
    execute(labelled, "UPDATE results SET tenant_id = 'globex' WHERE key = :k", k=key)
    found = check_results(labelled, ref)
    # The row no longer claims acme's partition, but it carries one of its keys.
    assert failed(found) == {"isolation"}
    assert found["isolation"].sample_keys == (f"results:{key} row tenant 'globex' is not 'acme'",)
    # globex's partition of the same slice sees a row whose key is not from its posts.
    other = check_results(labelled, ref.__class__(f"s{ref.slice:02d}|globex", "globex", ref.slice))
    assert "isolation" in failed(other)


def test_isolation_fails_on_a_ledger_row_of_another_slice(labelled: Engine) -> None:
    ref = busiest(labelled, ACME)
    key = one_key(labelled, ref)
    other_slice = (ref.slice + 1) % 16
    # A ledger row filed under the wrong slice: its post is not in that partition.
    execute(labelled, "UPDATE ledger_events SET slice = :s WHERE key = :k", s=other_slice, k=key)
    moved = check_results(labelled, ref.__class__(f"s{other_slice:02d}|acme", ACME, other_slice))
    assert "isolation" in failed(moved)


def test_no_duplicates_fails_on_a_key_both_accepted_and_dead_lettered(labelled: Engine) -> None:
    ref = busiest(labelled, ACME)
    key = one_key(labelled, ref)
    execute(
        labelled,
        "INSERT INTO dead_letters (key, tenant_id, post_id, slice, content_hash, model,"
        " key_version, task_version, outcome, reason, attempts, run_id, at)"
        " SELECT key, tenant_id, post_id, slice, content_hash, model, key_version,"
        " task_version, 'schema_rejected', 'test', 1, 'tamper', created_at"
        " FROM results WHERE key = :k",
        k=key,
    )
    found = check_results(labelled, ref)
    assert failed(found) == {"no_duplicates"}
    assert found["no_duplicates"].counts["problems"] == 1


def test_coverage_fails_on_a_missing_key(labelled: Engine) -> None:
    ref = busiest(labelled, ACME)
    key = one_key(labelled, ref)
    execute(labelled, "DELETE FROM results WHERE key = :k", k=key)
    found = check_results(labelled, ref)
    assert failed(found) == {"coverage"}
    assert found["coverage"].counts["missing"] == 1
    assert found["coverage"].sample_keys == (key,)


def test_output_schema_fails_on_a_label_outside_the_closed_set(labelled: Engine) -> None:
    ref = busiest(labelled, ACME)
    key = one_key(labelled, ref)
    execute(labelled, "UPDATE results SET label = 'nsfw' WHERE key = :k", k=key)
    found = check_results(labelled, ref)
    assert failed(found) == {"output_schema"}
    assert found["output_schema"].counts["invalid_rows"] == 1
    assert found["output_schema"].sample_keys[0].startswith(f"{key} row failed label_in_policy")


def _rebill(engine: Engine, key: str) -> None:
    # A second paid call for a finished key: what a crash between usage and result costs.
    attempt = f"rebill-{uuid.uuid4().hex[:8]}"
    for kind in ("attempt", "usage"):
        execute(
            engine,
            "INSERT INTO ledger_events (tenant_id, key, attempt_id, attempt_no, type, slice,"
            " post_id, content_hash, model, key_version, task_version, tokens_in, tokens_out,"
            " cost_nanos, run_id, at) SELECT tenant_id, key, :a, 2, :kind, slice, post_id,"
            " content_hash, model, key_version, task_version, 5000, 100, 0, 'tamper',"
            " created_at FROM results WHERE key = :k",
            a=attempt,
            kind=kind,
            k=key,
        )


def test_spend_fails_when_rebilled_tokens_exceed_the_bound(labelled: Engine) -> None:
    ref = busiest(labelled, ACME)
    key = one_key(labelled, ref)
    _rebill(labelled, key)
    found = check_results(labelled, ref)
    assert failed(found) == {"spend"}
    assert found["spend"].counts["rebilled_tokens"] == 5100
    assert found["spend"].sample_keys == (f"rebilled {key}",)
    # Within a looser bound the same ledger passes: the bound is configuration.
    assert check_results(labelled, ref, max_rebilled_share=1.0)["spend"].passed


def test_spend_fails_on_orphan_attempts_over_the_bound(labelled: Engine) -> None:
    ref = busiest(labelled, ACME)
    key = one_key(labelled, ref)
    execute(
        labelled,
        "INSERT INTO ledger_events (tenant_id, key, attempt_id, attempt_no, type, slice, post_id,"
        " content_hash, model, key_version, task_version, tokens_in, tokens_out, cost_nanos,"
        " run_id, at) SELECT tenant_id, key, 'orphan-1', 2, 'attempt', slice, post_id,"
        " content_hash, model, key_version, task_version, 0, 0, 0, 'tamper', created_at"
        " FROM results WHERE key = :k",
        k=key,
    )
    assert check_results(labelled, ref)["spend"].passed  # one orphan is within the default 16
    assert not check_results(labelled, ref, max_orphan_attempts=0)["spend"].passed


BASELINE = '{"ok": 0.97, "spam": 0.01, "abuse": 0.01, "needs_review": 0.01}'


def test_label_drift_warns_when_spam_is_five_times_the_baseline(labelled: Engine) -> None:
    ref = busiest(labelled, ACME)
    calm = check_results(labelled, ref, drift_baseline=BASELINE, drift_min_count=1)
    spam = calm["label_drift"].counts
    # acme's posts are 10% spam: 10x the configured 1% baseline.
    assert not calm["label_drift"].passed and calm["label_drift"].warn, spam
    assert "spam" in calm["label_drift"].summary
    assert calm["label_drift"].table is not None and "**drift**" in calm["label_drift"].table
    matching = '{"ok": 0.85, "spam": 0.1, "abuse": 0.05}'
    assert check_results(labelled, ref, drift_baseline=matching, drift_min_count=1)[
        "label_drift"
    ].passed


def test_label_drift_against_the_live_labels(labelled: Engine) -> None:
    ref = busiest(labelled, ACME)
    # No live labels yet: nothing to compare, the check passes and says why.
    first = check_results(labelled, ref, drift_min_count=1)["label_drift"]
    assert first.passed and "no live labels" in first.summary
    execute(labelled, "UPDATE posts SET moderation_label = 'ok' WHERE tenant_id = :t", t=ACME)
    drifted = check_results(labelled, ref, drift_min_count=1)["label_drift"]
    assert not drifted.passed and "live" in drifted.summary


def test_live_labels_of_many_tenants_are_each_tenants_own(labelled: Engine) -> None:
    # One grouped query for a run's tenants: each gets its own live labels, none others'.
    from backfill_assets.ledger.reports import live_label_counts

    execute(labelled, "UPDATE posts SET moderation_label = 'ok' WHERE tenant_id = :t", t=ACME)
    with labelled.connect() as conn:
        posts = dict(
            conn.execute(sa.text("SELECT tenant_id, count(*) FROM posts GROUP BY 1")).all()
        )
        got = live_label_counts(conn, [ACME, *(t for t in posts if t != ACME), "nobody"])
    assert got[ACME] == {"ok": posts[ACME]}
    assert all(got[t] == {} for t in got if t != ACME)


def test_drift_rule_is_pure_and_needs_a_minimum_count() -> None:
    rule = DriftRule(labels=("spam",), factor=5.0, min_count=3)
    base = {"ok": 0.95, "spam": 0.05}
    assert drifted_labels({"ok": 5, "spam": 5}, base, rule)[0] == ["spam"]
    assert drifted_labels({"ok": 1, "spam": 2}, base, rule)[0] == []  # too few to judge
    assert drifted_labels({"ok": 18, "spam": 2}, base, rule)[0] == []  # 10% < 5 x 5%


def test_policy_settings_are_validated_early() -> None:
    assert Settings.from_env({}).checks.apply_live is False
    assert Settings.from_env({"BACKFILL_APPLY_LIVE": "1"}).checks.apply_live is True
    labels = ("ok", "spam")
    assert parse_baseline('{"ok": 3, "spam": 1}', labels) == {"ok": 0.75, "spam": 0.25}
    for bad in (
        {"BACKFILL_DRIFT_BASELINE": '{"nsfw": 1}'},
        {"BACKFILL_DRIFT_BASELINE": "often"},
        {"BACKFILL_DRIFT_LABELS": "spam,nsfw"},
        {"BACKFILL_CHECK_MAX_REBILLED_SHARE": "lots"},
        {"BACKFILL_APPLY_LIVE": "maybe"},
    ):
        with pytest.raises(SettingsError, match=next(iter(bad))):
            Settings.from_env(bad)


def test_range_run_records_one_evaluation_per_partition_and_check(
    engine: Engine, store_url: str, tmp_path: Path
) -> None:
    load(engine, tmp_path, {ACME: 60})
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    (rec,) = run_job(store_url, instance, [ACME])
    assert rec.success and len(rec.partitions) == 16
    assert sorted(rec.checks) == sorted(rec.partitions)
    assert all({c.name for c in outcomes} == set(CHECK_NAMES) for outcomes in rec.checks.values())
    assert sorted(rec.applied) == sorted(rec.partitions)
    # The instance holds them per partition too (what the UI's check partition view reads):
    # one evaluation per partition for all seven checks, not seven (each is an event write).
    key = dg.AssetCheckKey(dg.AssetKey("moderation_labels"), "integrity")
    history = instance.event_log_storage.get_asset_check_execution_history(key, limit=100)
    assert {h.partition for h in history} == set(rec.partitions)
    assert {h.status.value for h in history} == {"SUCCEEDED"}
    evaluations = instance.get_records_for_run(
        rec.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
    ).records
    assert len(evaluations) == 16
