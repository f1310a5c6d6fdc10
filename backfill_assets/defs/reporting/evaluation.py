"""Gold-set evaluation of a policy, through the backfill's own keys, ledger and dispatcher.

The gold texts become posts of a tenant that holds gold sets (``--tenant``, default ``eval``,
never a customer's), so they follow every rule posts follow, and each policy's calls are the
keys of those posts under its identity: a rerun finds them done and pays nothing. Each
evaluation's figures are stored (``policy_evaluations``) for the ``policy_evaluation`` asset
and the ``BACKFILL_POLICY_MIN_MACRO_F1`` gate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import dagster as dg
from sqlalchemy.engine import Engine

from backfill_assets.config.stages import CASCADE_MODEL
from backfill_assets.config.variables import StoreSettings
from backfill_assets.defs.asset_keys import POLICY_EVALUATION
from backfill_assets.defs.model_resources import (
    CascadeModelResource,
    ModelResource,
    stage_runs,
    versions_for,
)
from backfill_assets.defs.partitions import partition_key_for
from backfill_assets.defs.reporting.cascade_gold import own_setting, read_stored, routed
from backfill_assets.defs.reporting.evaluation_report import frontier_link, report_links
from backfill_assets.defs.reporting.evaluation_tables import (
    calibration_table,
    confusion_table,
    evaluations_table,
    frontier_table,
    per_label_table,
)
from backfill_assets.defs.sealing import NO_CONFIG
from backfill_assets.dispatch.cascade_run import run_cascade
from backfill_assets.dispatch.partition_run import PartitionRef, RunOptions
from backfill_assets.dispatch.pipeline import run_partitions, with_levels
from backfill_assets.domain.money.nanos import usd_text, whole_nanos
from backfill_assets.domain.policy.calibration import calibration
from backfill_assets.domain.policy.evaluation import Comparison, Gate, compare, figures
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.domain.work.keys import SLICE_KEYS, Versions, work_key
from backfill_assets.domain.work.records import Post, Rejection
from backfill_assets.ingest.gold import GoldSet
from backfill_assets.ledger import evaluations as evals
from backfill_assets.ledger.engine import read_tx, write_tx
from backfill_assets.ledger.engines import store_engine
from backfill_assets.ledger.run.posts import ImportSummary, raise_slice_levels, write_batch

GATE_CHECK = "macro_f1_gate"


def gold_sha256(path: str | Path) -> str:
    """sha256 of the gold file's bytes: which gold set an evaluation was made on (read in
    chunks: a gold file may be large even when few of its rows are kept)."""
    with Path(path).open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def store_gold(engine: Engine, gold: GoldSet, tenant: str, source: str, target: int) -> None:
    """Claim ``tenant`` for gold sets and write the rows as its posts (rejects recorded, with
    their line numbers, as an import's are)."""
    with write_tx(engine) as conn:
        evals.claim_tenant(conn, tenant)
    batch: list[Post | Rejection] = [row.post for row in gold.rows]
    batch += gold.rejected
    write_batch(engine, source, batch, ImportSummary(), gold=True)
    raise_slice_levels(engine, [tenant], target)


def gold_refs(engine: Engine, tenant: str) -> list[PartitionRef]:
    """The partitions of the tenant that holds the gold set, at its slice level."""
    refs = with_levels(
        engine,
        [PartitionRef(partition_key_for(tenant, s), tenant, i) for i, s in enumerate(SLICE_KEYS)],
    )
    return [r for r in refs if r.slices]


@dataclass
class PolicyResult:
    """One policy's evaluation: its figures as a JSON report, each row's answer, and the id
    of the evaluation stored."""

    rubric: Rubric
    versions: Versions
    report: dict[str, Any]
    labels: list[str | None]
    evaluation_id: int


def gold_report(
    rubric: Rubric,
    versions: Versions,
    gold: GoldSet,
    answers: dict[str, evals.Answer],
    spend: tuple[int, int, int, int],
    calls_now: int,
) -> tuple[dict[str, Any], list[str | None]]:
    ids = [row.post.post_id for row in gold.rows]
    got = [answers[i] for i in ids]
    labels = [a.label for a in got]
    expected = [row.label for row in gold.rows]
    fig = figures(expected, labels, rubric.policy.label_ids, [a.outcome for a in got])
    cal = calibration(
        expected,
        labels,
        [a.score for a in got],
        rubric.policy.label_ids,
        [a.score_source for a in got],
    )
    rules: dict[str, dict[str, int]] = {}
    for row, answer in zip(gold.rows, got, strict=True):
        if row.rule is not None:
            entry = rules.setdefault(row.rule, {"support": 0, "found": 0})
            entry["support"] += 1
            entry["found"] += int(row.rule in answer.rule_ids)
    tokens_in, tokens_out, cost, calls = spend
    n = len(ids)
    report = {
        "policy": rubric.policy.identity,
        "key_version": rubric.key_version,
        "policy_id": rubric.policy.policy_id,
        "version": rubric.policy.version,
        "model": versions.model,
        # A cascade's decide rules are in it: the gate reads the evaluation of the rules in force.
        evals.MAPPING_FIELD: versions.mapping,
        "rows": n,
        "accuracy": fig.accuracy,
        "macro_f1": fig.macro_f1,
        "schema_rejected": fig.unlabelled.get("schema_rejected", 0),
        "schema_rejected_share": fig.schema_rejected_share,
        "unlabelled": dict(sorted(fig.unlabelled.items())),
        "labels": [f.as_dict() for f in fig.per_label],
        "confusion": {e: dict(row) for e, row in fig.confusion.items()},
        "rules": dict(sorted(rules.items())),
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "cost_usd": usd_text(cost),
        "cost_per_1000_posts_usd": usd_text(whole_nanos(Decimal(cost) * 1000 / n) if n else 0),
        "calls_booked": calls,
        "calls_this_run": calls_now,
        "calibration": cal.as_dict(),
    }
    return report, labels


def evaluate_policies(
    engine: Engine,
    gold: GoldSet,
    rubrics: Sequence[Rubric],
    model: ModelResource,
    options: RunOptions,
    tenant: str,
    source: tuple[str, str],
    log: Callable[[str], None] = lambda _m: None,
) -> list[PolicyResult]:
    """Label the gold set under each policy (what is done already is not sent again), then
    compute and store each one's figures. ``source``: the gold file's name and sha256."""
    refs = gold_refs(engine, tenant)
    ids = [row.post.post_id for row in gold.rows]
    wanted = set(ids)
    # A gold set is small and wanted now: one call per key, never a 24-hour batch.
    sync = dataclasses.replace(options, dispatch_mode="sync", batch=None)
    out: list[PolicyResult] = []
    for rubric in rubrics:
        versions = versions_for(model, rubric)
        run_id = f"evaluate-{uuid.uuid4().hex[:12]}"
        # The calls of a cascade are its stages' (each under its own keys); its labels are
        # composed from them.
        stages = stage_runs(model) if isinstance(model, CascadeModelResource) else None
        if stages is not None:
            reports = run_cascade(
                engine, refs, stages, versions, rubric, run_id, sync, log, only_posts=wanted
            )
        else:
            reports = run_partitions(
                engine,
                refs,
                model.build_adapter,
                versions,
                rubric,
                run_id,
                sync,
                log=log,
                only_posts=wanted,
            )
        calls_now = sum(r.stats.calls for r in reports)
        with read_tx(engine) as conn:
            answers = evals.answers(conn, tenant, ids, versions)
            if stages is None:
                keys = [
                    work_key(versions, tenant, i, row.post.content_hash)
                    for i, row in zip(ids, gold.rows, strict=True)
                ]
                spend = evals.booked(conn, tenant, keys)
            else:
                # The calls the cascade's routes make: a stage's answer stored for a post its
                # route does not reach (a sweep sends every post to every stage) is not its.
                route = [s.route for s in stages]
                stored = read_stored(conn, tenant, gold, route)
                spend = routed(stored, own_setting(route), rubric.policy.none_label)[1]
        report, labels = gold_report(rubric, versions, gold, answers, spend, calls_now)
        report["tenant"] = tenant
        report["gold"] = {"file": source[0], "sha256": source[1], "rows": len(ids)}
        with write_tx(engine) as conn:
            evaluation_id = evals.record(
                conn, rubric.policy, versions.model, tenant, (*source, len(ids)), report
            )
        out.append(PolicyResult(rubric, versions, report, labels, evaluation_id))
    return out


def comparison(against: PolicyResult, policy: PolicyResult) -> dict[str, Any]:
    """How the labels moved from ``against`` (the baseline) to ``policy``."""
    got: Comparison = compare(against.labels, policy.labels)
    return {
        "from": against.report["policy"],
        "to": policy.report["policy"],
        "agreement": got.agreement,
        "kappa": got.kappa,
        "transitions": {a: dict(sorted(row.items())) for a, row in sorted(got.transitions.items())},
    }


# --------------------------------------------------------------------------------- the gate


@dataclass(frozen=True)
class GateResult:
    """Whether a policy version with a model may be swept (``BACKFILL_POLICY_MIN_MACRO_F1``)."""

    passed: bool
    summary: str
    macro_f1: float | None


def gate_result(engine: Engine, rubric: Rubric, model: str, gate: Gate | None) -> GateResult:
    """The gate for ``rubric`` with ``model``: its latest evaluation has enough gold rows of
    every label and its macro-F1 reaches the minimum (no gate set: always passes)."""
    # A cascade's evaluation must be of the decide rules in force (its mapping version): a
    # threshold changes no key, and the sweep records the setting it chose.
    mapping = rubric.policy.mapping_version if model == CASCADE_MODEL else None
    with read_tx(engine) as conn:
        latest = evals.latest_evaluation(conn, rubric.key_version, model, mapping)
    f1 = latest.macro_f1 if latest is not None else None
    who = f"policy {rubric.policy.identity} with model {model}"
    if mapping is not None:
        who += f" and these decide rules (mapping {mapping})"
    if gate is None:
        return GateResult(True, "no gate (BACKFILL_POLICY_MIN_MACRO_F1 is not set)", f1)
    bar = f"BACKFILL_POLICY_MIN_MACRO_F1={gate.min_macro_f1:g}"
    if latest is None:
        return GateResult(
            False,
            f"{bar}: {who} has no evaluation; run `backfill-moderation evaluate GOLD` first",
            None,
        )
    gold = f"{Path(latest.gold_source).name} ({latest.gold_rows} rows)"
    support = {str(x["label"]): int(x["support"]) for x in latest.report.get("labels", [])}
    thin = gate.thin_labels(rubric.policy.label_ids, support)
    if thin:
        listed = ", ".join(f"{label} {n}" for label, n in thin)
        return GateResult(
            False,
            f"{bar}: not enough gold data for {who} in {gold}: gold rows per label {listed}; "
            f"the gate needs BACKFILL_POLICY_MIN_SUPPORT={gate.min_support} of every label",
            latest.macro_f1,
        )
    if latest.macro_f1 < gate.min_macro_f1:
        return GateResult(
            False, f"{bar}: {who} has macro-F1 {latest.macro_f1:.3f} on {gold}", latest.macro_f1
        )
    return GateResult(
        True,
        f"macro-F1 {latest.macro_f1:.3f} >= {gate.min_macro_f1:g} on {gold}, "
        f"at least {gate.min_support} gold rows of every label",
        latest.macro_f1,
    )


# ------------------------------------------------------------------- the asset and its check


def evaluation_metadata(engine: Engine, rubric: Rubric, model: str) -> dict[str, Any]:
    """What ``policy_evaluation`` shows: every version's latest evaluation, and the policy in
    force's per-label figures and confusion matrix."""
    mapping = rubric.policy.mapping_version if model == CASCADE_MODEL else None
    with read_tx(engine) as conn:
        every = evals.latest_evaluations(conn)
        current = evals.latest_evaluation(conn, rubric.key_version, model, mapping)
        swept = evals.latest_sweep(conn, CASCADE_MODEL)
    md: dict[str, Any] = {
        "evaluations": dg.MetadataValue.md(evaluations_table(every)),
        "policy": dg.MetadataValue.text(rubric.policy.identity),
        "model": dg.MetadataValue.text(model),
    }
    if current is not None:
        md["macro_f1"] = dg.MetadataValue.float(current.macro_f1)
        md["accuracy"] = dg.MetadataValue.float(current.accuracy)
        md["per_label"] = dg.MetadataValue.md(per_label_table(current.report))
        md["confusion_matrix"] = dg.MetadataValue.md(confusion_table(current.report))
        # Evaluations stored before calibration was measured have none.
        if "calibration" in current.report:
            ece = current.report["calibration"]["overall"]["ece"]
            if ece is not None:
                md["ece"] = dg.MetadataValue.float(ece)
            md["calibration"] = dg.MetadataValue.md(calibration_table(current.report))
        if current.report_dir is not None:
            md.update(report_links(current.report_dir))
    if swept is not None:
        md["cascade_frontier"] = dg.MetadataValue.md(frontier_table(swept.report))
        if swept.report_dir is not None:
            md.update(frontier_link(swept.report_dir))
    return md


def gate_evaluation(check_result: GateResult) -> dg.AssetCheckEvaluation:
    """The gate as an asset check evaluation of ``policy_evaluation``."""
    metadata: dict[str, Any] = {"summary": dg.MetadataValue.text(check_result.summary)}
    if check_result.macro_f1 is not None:
        metadata["macro_f1"] = dg.MetadataValue.float(check_result.macro_f1)
    return dg.AssetCheckEvaluation(
        asset_key=POLICY_EVALUATION,
        check_name=GATE_CHECK,
        passed=check_result.passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=check_result.summary,
        metadata=metadata,
    )


def build_policy_evaluation(rubric: Rubric, gate: Gate | None) -> dg.AssetsDefinition:
    """The ``policy_evaluation`` asset and its gate check, for the policy the definitions
    loaded (closed over, as the labels asset's) and ``BACKFILL_POLICY_MIN_MACRO_F1``."""

    @dg.asset(
        config_schema=NO_CONFIG,
        key=POLICY_EVALUATION,
        group_name="reporting",
        kinds={"sql"},
        check_specs=[
            dg.AssetCheckSpec(
                GATE_CHECK,
                asset=POLICY_EVALUATION,
                description="The policy in force has an evaluation whose macro-F1 reaches "
                "BACKFILL_POLICY_MIN_MACRO_F1 (passes when the gate is not set).",
            )
        ],
    )
    def policy_evaluation(
        store: dg.ResourceParam[StoreSettings], model: dg.ResourceParam[ModelResource]
    ) -> dg.MaterializeResult:  # type: ignore[type-arg]
        """Each policy version's latest gold-set evaluation (`backfill-moderation evaluate`)."""
        engine = store_engine(store)
        check_result = gate_result(engine, rubric, model.model, gate)
        check = gate_evaluation(check_result)
        return dg.MaterializeResult(
            metadata=evaluation_metadata(engine, rubric, model.model),
            check_results=[
                dg.AssetCheckResult(
                    check_name=GATE_CHECK,
                    passed=check.passed,
                    severity=check.severity,
                    description=check.description,
                    metadata=check.metadata,
                )
            ],
        )

    return policy_evaluation
