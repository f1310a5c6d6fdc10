"""A custom policy end to end, on both stores: its labels and rule ids through Dagster, the
checks, the apply and ``verify``; then the policy edited: every partition stale, the cost shown
before anything is sent, the rerun paying for the new version only, the old labels kept, and
the apply never going back to an older version (docs/policies.md)."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from dagster._utils.test.data_versions import get_stale_status_resolver
from sqlalchemy.engine import Engine

from backfill_assets.cli import build_parser
from backfill_assets.config.settings import Settings
from backfill_assets.config.variables import ChecksSettings
from backfill_assets.definitions import APPLY_JOB, BACKFILL_JOB, build_definitions
from backfill_assets.defs.labels.checks import check_results_for
from backfill_assets.dispatch.partition_run import PartitionRef
from backfill_assets.domain.policy.file import load_policy, parse_policy
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.ledger.labels.apply import apply_partitions
from backfill_assets.providers.models.base import ModelAdapter, ModelRequest, ModelResponse
from backfill_assets.runner.orchestrate import materialize
from backfill_assets.runner.verify import verify_store
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import count, refs_for, run, total
from backfill_tests.policy_helpers import COURSE_V5, edited, versions_of

TENANTS = ("learn", "code-club")
MODEL = "gpt-4o-mini"  # the fake model under a priced name, so dry-run shows a cost
# Text -> (label, rule ids) under the course rubric, as the fake model judges it.
POSTS: dict[str, tuple[str, str]] = {
    "My full solution for assignment 3, copy it (SOL-1)": ("solution_leak", "SOL-1"),
    "Last year's answer key: SOL-2": ("solution_leak", "SOL-2"),
    "SOL-1 and SOL-2 both, here is everything": ("solution_leak", "SOL-1,SOL-2"),
    "I do your week 5 project for $40, PAY-1": ("contract_cheating", "PAY-1"),
    "HAR-1: you are useless, quit the course": ("harassment", "HAR-1"),
    "BUY NOW limited offer http://cheap-watch.xyz": ("spam", "SPAM-1"),
    "Half my code below, is this needs_review?": ("needs_review", ""),
    "Week 3 lecture notes are up, thanks!": ("ok", ""),
}


def _records() -> list[dict[str, str]]:
    return [
        {"tenant_id": t, "post_id": f"p{i}-{j}", "text": f"{text} #{j}"}
        for t in TENANTS
        for i, text in enumerate(POSTS)
        for j in range(3)
    ]


N = len(_records())


def _env(store_url: str, tmp_path: Path, policy: Path, **more: str) -> dict[str, str]:
    return {
        "BACKFILL_DATABASE_URL": store_url,
        "DAGSTER_HOME": str(tmp_path / "home"),
        "BACKFILL_POLICY_PATH": str(policy),
        "BACKFILL_MODEL": MODEL,
        **more,
    }


def _materialize(
    instance: dg.DagsterInstance, env: dict[str, str], job: str = BACKFILL_JOB
) -> list[Any]:
    defs = build_definitions(env)
    return materialize(
        defs, instance, job, list(TENANTS), ["s00"], log_level="CRITICAL", apply_job=APPLY_JOB
    )


def _rows(engine: Engine, sql: str, **params: Any) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(sql), params).all())


def _dry_run(env: dict[str, str], capsys: pytest.CaptureFixture[str], *more: str) -> dict[str, Any]:
    capsys.readouterr()
    args = build_parser().parse_args(["dry-run", "--json", *more])
    assert args.func(args, Settings.from_env(env)) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_a_custom_policy_end_to_end_then_edited(
    engine: Engine, store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import_records(engine, tmp_path, _records(), slice_target=5_000)  # each tenant in s00
    v5 = Rubric(load_policy(COURSE_V5))
    assert (len(v5.policy.label_ids), len(v5.policy.rule_labels)) == (6, 5)
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))
    env5 = _env(store_url, tmp_path, COURSE_V5)

    # v5: labels and rule ids, checks, the apply, verify.
    records = _materialize(instance, env5)
    assert all(r.success for r in records) and not any(r.blocked() for r in records)
    pks = {pk for r in records for pk in r.partitions}
    assert pks == {f"s00|{t}" for t in TENANTS}
    assert all(c.passed for r in records for cs in r.checks.values() for c in cs if c.blocking)
    got = _rows(engine, "SELECT post_id, label, rule_ids, key_version FROM results")
    assert len(got) == N and {r.key_version for r in got} == {v5.key_version}
    texts = {f"p{i}-{j}": text for i, text in enumerate(POSTS) for j in range(3)}
    for r in got:
        assert (r.label, r.rule_ids) == POSTS[texts[r.post_id]], r
    md = records[0].metadata[records[0].partitions[0]]
    assert "| SOL-1 | solution_leak |" in md["rule_distribution"]
    assert md["policy"] == v5.policy.identity
    applied = _rows(
        engine,
        "SELECT policy_id, label, rule_ids, policy_version, key_version FROM applied_labels",
    )
    assert len(applied) == N
    assert {(a.policy_id, a.policy_version, a.key_version) for a in applied} == {
        ("course-rubric", "5", v5.key_version)
    }
    assert {(a.label, a.rule_ids) for a in applied} == set(POSTS.values())
    assert count(engine, "SELECT count(*) FROM posts WHERE moderation_label_shadow IS NULL") == 0
    v5_versions = versions_of(v5, MODEL)
    assert verify_store(engine, v5_versions).as_dict(require_complete=True)["ok"]
    # label_drift watches the course's flagging labels (action review or hide), not the
    # built-in ones: against a baseline where every post is ok, each of them has drifted.
    ref = PartitionRef(key="s00|learn", tenant_id="learn", slice=0, level=0)  # all of learn
    bounds = ChecksSettings(drift_baseline='{"ok": 1}', drift_min_count=1)
    found = check_results_for(engine, ref, v5_versions, v5, bounds)
    drift = {v.name: v for v in found}["label_drift"]
    watched = set(v5.policy.flagging_labels)
    assert watched == set(v5.policy.label_ids) - {"ok"} and "abuse" not in watched
    assert not drift.passed and drift.counts["drifted_labels"] == len(watched), drift.table

    # Edit one rule's text (and bump the version): new work under a new identity.
    v6_file = edited(COURSE_V5, tmp_path / "v6.yaml", "for money or favours", "for money")
    v6_file.write_text(v6_file.read_text().replace('version: "5"', 'version: "6"'))
    env6 = _env(store_url, tmp_path, v6_file)
    v6 = Rubric(load_policy(v6_file))
    defs6 = build_definitions(env6)
    assets = [defs6.resolve_assets_def(k) for k in ("posts", "moderation_labels")]
    resolver = get_stale_status_resolver(instance, assets)
    key = dg.AssetKey("moderation_labels")
    assert {resolver.get_status(key, pk).value for pk in pks} == {"STALE"}
    causes = {c.category.value for pk in pks for c in resolver.get_stale_root_causes(key, pk)}
    assert causes == {"CODE"}

    # What the change costs, before anything is sent: every key of every tenant, in both modes.
    calls_before = count(engine, "SELECT count(*) FROM ledger_events WHERE type = 'attempt'")
    plan = _dry_run(env6, capsys)
    assert plan["policy"] == v6.policy.identity
    assert {t["tenant"]: t["keys"] for t in plan["tenants"]} == dict.fromkeys(TENANTS, N // 2)
    for t in plan["tenants"]:
        assert Decimal(t["estimated_cost_usd"]) > 0
        # Half the list price, exactly (to one rounding per call).
        half = Decimal(t["estimated_cost_usd"]) / 2
        assert abs(Decimal(t["estimated_cost_usd_batch"]) - half) <= Decimal(t["keys"]) * Decimal(
            "0.000000001"
        )
    # The same question of a file the environment does not name: dry-run --policy.
    assert _dry_run(env5, capsys, "--policy", str(v6_file)) == plan
    assert count(engine, "SELECT count(*) FROM ledger_events WHERE type = 'attempt'") == (
        calls_before
    )

    # The rerun pays for the new version only; the old version's results stay.
    records = _materialize(instance, env6)
    assert all(r.success for r in records)
    calls = sum(r.metadata[pk]["model_calls"] for r in records for pk in r.partitions)
    assert calls == N
    by_version = dict(
        _rows(engine, "SELECT key_version, count(*) FROM results GROUP BY key_version")
    )
    assert by_version == {v5.key_version: N, v6.key_version: N}
    billed = _rows(
        engine, "SELECT key, count(*) FROM ledger_events WHERE type = 'usage' GROUP BY key"
    )
    assert len(billed) == 2 * N and {n for _k, n in billed} == {1}  # each key paid once
    assert {a[0] for a in _rows(engine, "SELECT DISTINCT key_version FROM applied_labels")} == {
        v6.key_version
    }

    # v5's apply finishing after v6's changes nothing: the newer version's labels stay.
    records = _materialize(instance, env5, APPLY_JOB)
    assert all(r.success for r in records)
    assert {a[0] for a in _rows(engine, "SELECT DISTINCT key_version FROM applied_labels")} == {
        v6.key_version
    }
    shadow = _rows(engine, "SELECT DISTINCT moderation_rubric_version_shadow FROM posts")
    assert [s[0] for s in shadow] == [versions_of(v6, MODEL).code_version]
    for versions in (v5_versions, versions_of(v6, MODEL)):
        assert verify_store(engine, versions).as_dict()["ok"]
    instance.dispose()


def test_the_apply_never_regresses_whatever_order_runs_finish_in(
    engine: Engine, tmp_path: Path
) -> None:
    import_records(engine, tmp_path, _records(), slice_target=5_000)
    text = COURSE_V5.read_text()
    v5 = Rubric(parse_policy(text))
    v10 = Rubric(parse_policy(text.replace('version: "5"', 'version: "10"')))
    # The same human version edited: the later edit is the newer one.
    ten = text.replace('version: "5"', 'version: "10"')
    v10b = Rubric(parse_policy(ten.replace("$40", "$50")))
    for rubric in (v5, v10, v10b):
        run(engine, ["learn"], versions=versions_of(rubric), rubric=rubric)
    every_slice = refs_for(["learn"], [0])[0].at_level(0).slices  # the tenant lives in s00

    def apply(rubric: Rubric) -> int:
        with engine.begin() as conn:
            (rep,) = apply_partitions(
                conn, [("learn", every_slice)], versions_of(rubric), rubric.policy, live=False
            )
        return rep.changed

    def held() -> set[str]:
        return {r[0] for r in _rows(engine, "SELECT DISTINCT key_version FROM applied_labels")}

    assert apply(v10) == N // 2 and held() == {v10.key_version}
    assert apply(v5) == 0 and held() == {v10.key_version}  # 5 < 10, not as text
    assert apply(v10b) == N // 2 and held() == {v10b.key_version}  # same version, later
    assert apply(v10) == 0 and apply(v5) == 0 and held() == {v10b.key_version}
    assert apply(v10b) == 0  # a replay writes nothing


class CrossLabel(ModelAdapter):
    """Answers with a rule of another label, a label not in the policy, or correctly."""

    name = "cross-label"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.stats.calls += 1
        n = int(request.post_id.split("-")[1])
        label, rules = [
            ("solution_leak", ["PAY-1"]),  # PAY-1 leads to contract_cheating
            ("cheating", []),  # not a label of the course rubric
            ("contract_cheating", []),  # a label with rules needs one
        ][n]
        if request.post_id.startswith("p7"):
            label, rules = "ok", []
        raw = json.dumps(
            {
                "schema_version": 1,
                "correlation_id": request.key,
                "label": label,
                "rule_ids": rules,
                "confidence": 0.9,
            }
        )
        return ModelResponse(raw_text=raw, tokens_in=10, tokens_out=5, request_id="r")


def test_an_answer_outside_the_policy_is_schema_rejected(engine: Engine, tmp_path: Path) -> None:
    import_records(engine, tmp_path, _records(), slice_target=5_000)
    v5 = Rubric(load_policy(COURSE_V5))
    reports, _ = run(engine, ["learn"], adapter=CrossLabel(), versions=versions_of(v5), rubric=v5)
    assert total(reports, "accepted") == 3  # the "ok" posts (p7-*)
    assert total(reports, "schema_rejected") == N // 2 - 3
    reasons = {r[0] for r in _rows(engine, "SELECT DISTINCT reason FROM dead_letters")}
    assert reasons == {
        "output contract: rule_ids names a rule of another label",
        "output contract: label not in the policy",
        "output contract: rule_ids is empty for a label that has rules",
    }
