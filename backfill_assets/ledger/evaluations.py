"""Gold-set evaluations in the store: the tenants that hold gold sets, what a policy answered
for them, what it cost, and each evaluation's figures (``policy_evaluations``, sql/011)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.domain.policy.calibration import label_score
from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.work.events import EventKind
from backfill_assets.domain.work.keys import Versions, work_key
from backfill_assets.ledger.dialect import insert_for
from backfill_assets.ledger.tables import (
    dead_letters,
    ledger_events,
    policy_evaluations,
    posts,
    results,
    tenants,
    utcnow,
)

EVALUATION = "evaluation"
# Report fields: the mapping version the labels were read under (a cascade's decide rules are
# in it), and the threshold sweep that chose the setting evaluated.
MAPPING_FIELD = "mapping_version"
SWEEP_FIELD = "sweep"
_IN_CHUNK = 5_000


class CustomerTenant(ValueError):
    """``evaluate --tenant`` named a customer's tenant: evaluations are never booked there."""


def claim_tenant(conn: Connection, tenant_id: str) -> bool:
    """Make ``tenant_id`` a tenant that holds gold sets (True if it was new); a customer's
    tenant (one imported for moderation) raises ``CustomerTenant``."""
    found = conn.execute(
        sa.select(tenants.c.purpose).where(tenants.c.tenant_id == tenant_id)
    ).first()
    if found is not None:
        if found[0] != EVALUATION:
            raise CustomerTenant(
                f"tenant {tenant_id} is a customer's (its posts are moderated); book "
                "evaluations to a tenant of their own (--tenant, default eval)"
            )
        return False
    conn.execute(
        insert_for(conn, tenants)
        .values(
            tenant_id=tenant_id,
            billed_tokens=0,
            created_at=utcnow(),
            slice_level=0,
            purpose=EVALUATION,
        )
        .on_conflict_do_nothing()
    )
    # A concurrent import may have created it as a customer's tenant in between.
    purpose = conn.execute(
        sa.select(tenants.c.purpose).where(tenants.c.tenant_id == tenant_id)
    ).scalar_one()
    if purpose != EVALUATION:
        raise CustomerTenant(f"tenant {tenant_id} is a customer's")
    return True


@dataclass(frozen=True, slots=True)
class Answer:
    """What a policy answered for one gold post: a label (None if none was accepted), its
    rule ids, the outcome (``accepted``, a dead letter's, or ``missing``), and with a label
    its score and the score's source (``label_score``), and the stored confidence and
    ``p_label`` it was read from (a cascade's stage score, ``stage_score``, needs both)."""

    label: str | None
    rule_ids: tuple[str, ...]
    outcome: str
    score: float | None = None
    score_source: str | None = None
    confidence: float | None = None
    p_label: float | None = None


def _chunks(items: Sequence[str]) -> Iterable[list[str]]:
    for i in range(0, len(items), _IN_CHUNK):
        yield list(items[i : i + _IN_CHUNK])


def answers(
    conn: Connection, tenant_id: str, post_ids: Sequence[str], versions: Versions
) -> dict[str, Answer]:
    """Each gold post's answer under ``versions``, for its current text."""
    hashes: dict[str, str] = {}
    for chunk in _chunks(post_ids):
        hashes.update(
            conn.execute(
                sa.select(posts.c.post_id, posts.c.content_hash).where(
                    posts.c.tenant_id == tenant_id, posts.c.post_id.in_(chunk)
                )
            ).all()
        )
    keys = {work_key(versions, tenant_id, p, h): p for p, h in hashes.items()}
    out = {p: Answer(None, (), "missing") for p in post_ids}
    key_list = sorted(keys)
    for chunk in _chunks(key_list):
        for key, label, rules, confidence, p_label in conn.execute(
            sa.select(
                results.c.key,
                results.c.label,
                results.c.rule_ids,
                results.c.confidence,
                results.c.p_label,
            ).where(results.c.key.in_(chunk))
        ):
            score, source = label_score(p_label, confidence)
            out[keys[key]] = Answer(
                str(label),
                tuple(str(rules).split(",")) if rules else (),
                "accepted",
                score,
                source,
                float(confidence),
                None if p_label is None else float(p_label),
            )
        for key, outcome in conn.execute(
            sa.select(dead_letters.c.key, dead_letters.c.outcome).where(
                dead_letters.c.key.in_(chunk)
            )
        ):
            if out[keys[key]].outcome == "missing":
                out[keys[key]] = Answer(None, (), str(outcome))
    return out


def booked(conn: Connection, tenant_id: str, keys: Sequence[str]) -> tuple[int, int, int, int]:
    """(tokens in, tokens out, nano-dollars, calls) the ledger booked for these keys."""
    totals = [0, 0, 0, 0]
    le = ledger_events
    for chunk in _chunks(sorted(keys)):
        row = conn.execute(
            sa.select(
                sa.func.coalesce(sa.func.sum(le.c.tokens_in), 0),
                sa.func.coalesce(sa.func.sum(le.c.tokens_out), 0),
                sa.func.coalesce(sa.func.sum(le.c.cost_nanos), 0),
                sa.func.count(),
            ).where(le.c.tenant_id == tenant_id, le.c.type == EventKind.USAGE, le.c.key.in_(chunk))
        ).one()
        totals[0] += int(row[0])
        totals[1] += int(row[1])
        totals[2] += int(row[2])
        totals[3] += int(row[3])
    return totals[0], totals[1], totals[2], totals[3]


def booked_by_key(
    conn: Connection, tenant_id: str, keys: Sequence[str]
) -> dict[str, tuple[int, int, int, int]]:
    """Per key: (tokens in, tokens out, nano-dollars, calls) the ledger booked for it (keys
    never booked are left out)."""
    le = ledger_events
    out: dict[str, tuple[int, int, int, int]] = {}
    for chunk in _chunks(sorted(keys)):
        for key, tokens_in, tokens_out, nanos, calls in conn.execute(
            sa.select(
                le.c.key,
                sa.func.coalesce(sa.func.sum(le.c.tokens_in), 0),
                sa.func.coalesce(sa.func.sum(le.c.tokens_out), 0),
                sa.func.coalesce(sa.func.sum(le.c.cost_nanos), 0),
                sa.func.count(),
            )
            .where(le.c.tenant_id == tenant_id, le.c.type == EventKind.USAGE, le.c.key.in_(chunk))
            .group_by(le.c.key)
        ):
            out[str(key)] = (int(tokens_in), int(tokens_out), int(nanos), int(calls))
    return out


def record(
    conn: Connection,
    policy: Policy,
    model: str,
    tenant_id: str,
    gold: tuple[str, str, int],
    report: dict[str, Any],
) -> int:
    """Store one evaluation (``gold``: source, sha256, rows; ``report``: figures only);
    returns its id."""
    source, sha, rows = gold
    return int(
        conn.execute(
            policy_evaluations.insert()
            .values(
                key_version=policy.key_version,
                identity=policy.identity,
                policy_id=policy.policy_id,
                version=policy.version,
                model=model,
                tenant_id=tenant_id,
                gold_source=source[:500],
                gold_sha256=sha,
                gold_rows=rows,
                accuracy=float(report["accuracy"]),
                macro_f1=float(report["macro_f1"]),
                schema_rejected_share=float(report["schema_rejected_share"]),
                report=json.dumps(report, sort_keys=True),
                created_at=utcnow(),
            )
            .returning(policy_evaluations.c.id)
        ).scalar_one()
    )


def set_report_dir(conn: Connection, evaluation_id: int, folder: str) -> None:
    """Record where ``evaluate --report`` wrote an evaluation's pictures (once they are there)."""
    pe = policy_evaluations
    conn.execute(pe.update().where(pe.c.id == evaluation_id).values(report_dir=folder))


@dataclass(frozen=True)
class Evaluation:
    """A stored evaluation."""

    key_version: str
    identity: str
    model: str
    gold_source: str
    gold_rows: int
    accuracy: float
    macro_f1: float
    schema_rejected_share: float
    report: dict[str, Any]
    created_at: object
    report_dir: str | None = None


def _evaluation(row: Any) -> Evaluation:
    return Evaluation(
        key_version=str(row.key_version),
        identity=str(row.identity),
        model=str(row.model),
        gold_source=str(row.gold_source),
        gold_rows=int(row.gold_rows),
        accuracy=float(row.accuracy),
        macro_f1=float(row.macro_f1),
        schema_rejected_share=float(row.schema_rejected_share),
        report=json.loads(row.report),
        created_at=row.created_at,
        report_dir=None if row.report_dir is None else str(row.report_dir),
    )


def latest_evaluations(conn: Connection) -> list[Evaluation]:
    """Each (policy version, model)'s latest evaluation, newest first."""
    pe = policy_evaluations
    newest = (
        sa.select(sa.func.max(pe.c.id).label("id"))
        .group_by(pe.c.key_version, pe.c.model)
        .subquery()
    )
    rows = conn.execute(
        sa.select(pe).where(pe.c.id.in_(sa.select(newest.c.id))).order_by(pe.c.id.desc())
    )
    return [_evaluation(r) for r in rows]


def latest_evaluation(
    conn: Connection, key_version: str, model: str, mapping: str | None = None
) -> Evaluation | None:
    """The latest evaluation of a policy version with a model (None: never evaluated);
    with ``mapping``, the latest whose report names that mapping version (a cascade's decide
    rules: ``MAPPING_FIELD``)."""
    pe = policy_evaluations
    query = sa.select(pe).where(pe.c.key_version == key_version, pe.c.model == model)
    if mapping is None:
        row = conn.execute(query.order_by(pe.c.id.desc()).limit(1)).first()
        return None if row is None else _evaluation(row)
    # Narrowed in SQL by the report's text (sorted-key JSON), then checked on the parsed report.
    quoted = json.dumps({MAPPING_FIELD: mapping})[1:-1]
    for row in conn.execute(
        query.where(pe.c.report.contains(quoted, autoescape=True)).order_by(pe.c.id.desc())
    ):
        found = _evaluation(row)
        if found.report.get(MAPPING_FIELD) == mapping:
            return found
    return None


def latest_sweep(conn: Connection, model: str) -> Evaluation | None:
    """The latest evaluation of ``model`` (a cascade's) recorded by a threshold sweep: its
    report holds the sweep (``SWEEP_FIELD``)."""
    pe = policy_evaluations
    quoted = json.dumps(SWEEP_FIELD) + ": {"
    for row in conn.execute(
        sa.select(pe)
        .where(pe.c.model == model, pe.c.report.contains(quoted, autoescape=True))
        .order_by(pe.c.id.desc())
    ):
        found = _evaluation(row)
        if isinstance(found.report.get(SWEEP_FIELD), dict):
            return found
    return None


def gold_shares(
    conn: Connection, key_version: str, model: str, mapping: str
) -> dict[str, float] | None:
    """The share of the gold set's posts each stage of a cascade decided under these decide
    rules (``mapping``), from the latest threshold sweep that recorded them (None: none did;
    a plain ``evaluate`` of the same rules records no shares)."""
    pe = policy_evaluations
    quoted = json.dumps({MAPPING_FIELD: mapping})[1:-1]
    query = (
        sa.select(pe)
        .where(
            pe.c.key_version == key_version,
            pe.c.model == model,
            pe.c.report.contains(quoted, autoescape=True),
        )
        .order_by(pe.c.id.desc())
    )
    for row in conn.execute(query):
        report = _evaluation(row).report
        sweep = report.get(SWEEP_FIELD)
        if report.get(MAPPING_FIELD) != mapping or not isinstance(sweep, dict):
            continue
        kept = sweep.get("chosen") or sweep.get("own")
        decided = kept.get("decided") if isinstance(kept, dict) else None
        if isinstance(decided, dict):
            # In the stages' order (the report's JSON keys are sorted).
            order = [str(n) for n in sweep.get("stages", [])] or sorted(decided)
            return {n: float(decided[n]) for n in order if n in decided}
    return None
