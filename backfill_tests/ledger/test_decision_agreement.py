"""Agreement between the model and moderators, on both stores: the pairs are counted in SQL
from the newest decision about each post's current text and the model's result under the
decision's policy version, and the ``agreement`` check reports them (a warning under
``BACKFILL_CHECK_MIN_KAPPA``, never blocking; "no decisions yet" before any)."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.config.variables import ChecksSettings
from backfill_assets.defs.labels.checks import check_results_for_many, group_metadata
from backfill_assets.dispatch.pipeline import with_levels
from backfill_assets.domain.checks.catalog import (
    CHECK_GROUPS,
    CHECK_NAMES,
    CheckResult,
    group_results,
)
from backfill_assets.domain.policy.agreement import agreement
from backfill_assets.ledger.decisions.agreement import agreement_pairs, pairs_by_tenant
from backfill_assets.ledger.evidence import check_pool
from backfill_assets.ledger.tables import results
from backfill_tests.decision_helpers import record_decision
from backfill_tests.moderation_helpers import busiest, check_results, execute, load, run_job
from backfill_tests.pipeline_helpers import RUBRIC, VERSIONS, refs_for, run

ACME, GLOBEX = "acme", "globex"
T0 = dt.datetime(2026, 11, 1, 12, 0, 0)


def decide(
    engine: Engine,
    tenant: str,
    post_id: str,
    label: str,
    at: dt.datetime = T0,
    reviewer: str = "r-1",
    key_version: str = VERSIONS.key_version,
    content_hash: str | None = None,
) -> None:
    """A moderator's decision, inserted as an import would (the post's text unless given),
    then applied."""
    record_decision(
        engine,
        tenant,
        post_id,
        label,
        policy=RUBRIC.policy,
        at=at,
        reviewer=reviewer,
        key_version=key_version,
        content_hash=content_hash,
    )


def model_labels(engine: Engine, tenant: str) -> dict[str, str]:
    """The model's label of each of the tenant's posts."""
    with engine.connect() as conn:
        found = conn.execute(
            sa.select(results.c.post_id, results.c.label).where(results.c.tenant_id == tenant)
        )
        return {str(p): str(label) for p, label in found}


def _flip(label: str) -> str:
    return "ok" if label != "ok" else "spam"


@pytest.fixture
def labelled(engine: Engine, tmp_path: Path) -> Engine:
    """Two tenants labelled by the pipeline (spam every 4th post, some abuse)."""
    load(engine, tmp_path, {ACME: 40, GLOBEX: 12}, spam_every=4)
    run(engine, [ACME, GLOBEX])
    return engine


def _pairs(
    engine: Engine, tenants: list[str] | None = None
) -> dict[str, dict[tuple[str, str], int]]:
    policy = RUBRIC.policy
    with engine.connect() as conn:
        found = agreement_pairs(
            conn,
            policy.policy_id,
            VERSIONS.model,
            VERSIONS.task_version,
            tenants,
            VERSIONS.key_version,
        )
    return {t: dict(p) for t, p in pairs_by_tenant(found).items()}


def test_pairs_are_the_newest_decision_against_the_models_label(labelled: Engine) -> None:
    model = model_labels(labelled, ACME)
    assert Counter(model.values())["spam"] == 10 and "abuse" in model.values()
    assert _pairs(labelled) == {}
    expected: Counter[tuple[str, str]] = Counter()
    # 24 posts decided: the moderators agree with the model on 18, overturn 6.
    for i in range(24):
        pid = f"p{i:04d}"
        human = _flip(model[pid]) if i % 4 == 1 else model[pid]
        decide(labelled, ACME, pid, human)
        expected[(model[pid], human)] += 1
    # A later decision about a post replaces the earlier one in the pairs (an appeal).
    decide(labelled, ACME, "p0000", _flip(model["p0000"]), at=T0 + dt.timedelta(days=1))
    expected[(model["p0000"], model["p0000"])] -= 1
    expected[(model["p0000"], _flip(model["p0000"]))] += 1
    # Not a pair: a decision about an older text of the post, one under another policy
    # version (no result of the model under it), and another tenant's decision.
    decide(labelled, ACME, "p0030", "abuse", content_hash="0" * 64)
    decide(labelled, ACME, "p0031", "abuse", key_version="kv-of-another-version")
    g_model = model_labels(labelled, GLOBEX)
    decide(labelled, GLOBEX, "p0000", g_model["p0000"])
    got = _pairs(labelled)
    assert got[ACME] == {k: n for k, n in expected.items() if n}
    assert sum(got[ACME].values()) == 24
    assert got[GLOBEX] == {(g_model["p0000"], g_model["p0000"]): 1}
    assert _pairs(labelled, [GLOBEX]) == {GLOBEX: got[GLOBEX]}
    # Every version's counts: the other version's decision has no model result either.
    with labelled.connect() as conn:
        every = agreement_pairs(
            conn, RUBRIC.policy.policy_id, VERSIONS.model, VERSIONS.task_version, [ACME]
        )
    assert {p.policy_version for p in every} == {RUBRIC.policy.version}
    assert sum(p.posts for p in every) == 24
    # An edited post leaves the pairs: its decision is about the old text.
    execute(labelled, "UPDATE posts SET content_hash = :h WHERE post_id = 'p0002'", h="1" * 64)
    assert sum(_pairs(labelled)[ACME].values()) == 23


def test_the_agreement_check_warns_under_the_minimum_kappa_and_never_blocks(
    labelled: Engine,
) -> None:
    assert "agreement" in CHECK_NAMES and "agreement" in CHECK_GROUPS[0].members
    ref = busiest(labelled, ACME)
    none = check_results(labelled, ref)["agreement"]
    assert none.passed and none.summary == "no decisions yet"
    model = model_labels(labelled, ACME)
    # 12 decided posts, moderators overturning half: kappa well under 0.6.
    pairs: Counter[tuple[str, str]] = Counter()
    for i in range(12):
        pid = f"p{i:04d}"
        human = _flip(model[pid]) if i % 2 else model[pid]
        decide(labelled, ACME, pid, human)
        pairs[(model[pid], human)] += 1
    want = agreement(pairs)
    assert want.kappa.value is not None and want.kappa.value < 0.6
    found = check_results(labelled, ref)
    got = found["agreement"]
    assert not got.passed and got.warn and not got.blocking
    assert got.counts["decided_posts"] == 12 and got.counts["agreement"] == 0.5
    assert got.counts["kappa"] == round(want.kappa.value, 4)
    assert got.counts["kappa_low"] < got.counts["kappa"] < got.counts["kappa_high"]
    assert f"kappa {want.kappa.value:.3f}" in got.summary and "under 0.6" in got.summary
    assert got.table is not None and "| spam |" in got.table
    # Every other member passes: the group is a warning that gates nothing.
    [group] = group_results(found.values())
    assert [v.name for v in group.failed] == ["agreement"]
    assert group.warn_only and not group.blocks
    md = group_metadata(group)
    assert md["agreement.kappa"] == got.counts["kappa"]
    assert isinstance(md["agreement.table"], dg.MarkdownMetadataValue)
    # A lower minimum: the same figures pass, and the labels table is still in the metadata.
    low = check_results(labelled, ref, min_kappa=-1.0)["agreement"]
    assert low.passed and {**low.counts, "min_kappa": 0.6} == got.counts
    [passing] = group_results(check_results(labelled, ref, min_kappa=-1.0).values())
    assert "agreement.table" in group_metadata(passing)
    # Too few decided posts to judge: under the drift check's minimum count it passes.
    few = check_results(labelled, ref, drift_min_count=50)["agreement"]
    assert few.passed and "too few to judge" in few.summary
    # Another tenant's partitions see only their own decisions.
    other = busiest(labelled, GLOBEX)
    assert check_results(labelled, other)["agreement"].summary == "no decisions yet"


def test_check_workers_report_the_same_agreement(labelled: Engine) -> None:
    model = model_labels(labelled, ACME)
    for i in range(10):
        pid = f"p{i:04d}"
        decide(labelled, ACME, pid, _flip(model[pid]) if i % 3 == 0 else model[pid])
    refs = with_levels(labelled, refs_for([ACME, GLOBEX]))
    pooling = check_pool.Pooling(min_posts=0, chunk_posts=10, workers=2)
    logged: list[str] = []

    def agreement_of(pool: check_pool.Pooling | None) -> dict[str, CheckResult]:
        found = check_results_for_many(
            labelled, refs, VERSIONS, RUBRIC, ChecksSettings(), log=logged.append, pooling=pool
        )
        return {pk: v for pk, vs in found.items() for v in vs if v.name == "agreement"}

    serial = agreement_of(None)
    pooled = agreement_of(pooling)
    assert any("worker processes" in m for m in logged) and pooled == serial
    acme = {v.summary for pk, v in pooled.items() if pk.endswith(ACME)}
    assert len(acme) == 1 and "over 10 decided post(s)" in acme.pop()
    assert {v.summary for pk, v in pooled.items() if pk.endswith(GLOBEX)} == {"no decisions yet"}


def test_dagster_records_the_agreement_in_integrity_as_a_warning(
    engine: Engine, store_url: str, tmp_path: Path
) -> None:
    load(engine, tmp_path, {ACME: 40}, spam_every=4)
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    (first,) = run_job(store_url, instance, [ACME])
    assert first.success
    model = model_labels(engine, ACME)
    for i in range(12):
        pid = f"p{i:04d}"
        decide(engine, ACME, pid, _flip(model[pid]) if i % 2 else model[pid])
    (rec,) = run_job(store_url, instance, [ACME])
    # A warning never blocks: every partition is applied.
    assert rec.success and sorted(rec.applied) == sorted(rec.partitions)
    key = dg.AssetCheckKey(dg.AssetKey("moderation_labels"), "integrity")
    history = instance.event_log_storage.get_asset_check_execution_history(key, limit=100)
    latest: dict[str | None, Any] = {}
    for h in sorted(history, key=lambda h: h.id):
        assert h.event is not None and h.event.dagster_event is not None
        latest[h.partition] = h.event.dagster_event.event_specific_data
    assert set(latest) == set(rec.partitions)
    for evaluation in latest.values():
        assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.WARN
        assert not evaluation.blocking
        md = evaluation.metadata
        assert md["agreement.decided_posts"].value == 12 and md["agreement.agreement"].value == 0.5
        assert md["agreement.kappa"].value < 0.6 and "| ok |" in md["agreement.table"].value
        assert json.loads(md["checks_json"].value)[-1] == {
            "name": "agreement",
            "passed": False,
            "blocking": False,
            "warn": True,
        }
