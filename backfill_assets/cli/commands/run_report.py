"""What ``backfill-moderation run`` prints: per partition, outcomes, checks and the apply."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from backfill_assets.domain.money import usd_text

if TYPE_CHECKING:
    from backfill_assets.runner.api import Plan, RunRecord

TOTAL_KEYS = (
    "posts",
    "skipped_done",
    "model_calls",
    "tokens_in",
    "tokens_out",
    "accepted",
    "schema_rejected",
    "retry_exhausted",
    "transport_rejected",
    "deferred",
    "relabelled",
    "rerouted",
)
# What a cascade's run says per stage: posts sent, calls, their cost, posts whose label it decided.
_STAGE_FIGURES = ("sent", "calls", "cost_nanos", "decided")
HUMAN_COLUMNS = [
    "partition",
    "posts",
    "skipped_done",
    "model_calls",
    "accepted",
    "schema_rejected",
    "retry_exhausted",
    "transport_rejected",
    "deferred",
    "tokens_in",
    "tokens_out",
    "checks",
    "applied",
]


def _partition_row(rec: RunRecord, pk: str) -> dict[str, Any]:
    md = rec.metadata[pk]
    row: dict[str, Any] = {"partition": pk, "run_id": rec.run_id}
    for k in ("posts", "skipped_done", "model_calls", "tokens_in", "tokens_out"):
        row[k] = int(md.get(k, 0))
    # Labels re-read from stored answers under a changed mapping (no call made for them).
    row["relabelled"] = int(md.get("relabelled_from_stored", 0))
    # A cascade's labels re-routed by a changed decide rule, and its stages (no call made).
    row["rerouted"] = int(md.get("rerouted_from_stored", 0))
    stages = md.get("stages")
    if isinstance(stages, list):
        row["stages"] = [dict(s) for s in stages if isinstance(s, dict) and "stage" in s]
    for k, v in md.items():
        if k.startswith("outcome_"):
            row[k[len("outcome_") :]] = int(v)
    return row


def run_document(
    records: Sequence[RunRecord], plan: Plan | None = None, processes: int = 1
) -> dict[str, Any]:
    """The ``run --json`` document: runs, partitions (with checks and apply), the partitions
    skipped with their reason, and totals (``processes``: how many ran the plan's boxes)."""
    applied = {pk for r in records for pk in r.applied}
    checks: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        for pk, outcomes in rec.checks.items():
            checks[pk] = [
                {"name": c.name, "passed": c.passed, "blocking": c.blocking, "severity": c.severity}
                for c in outcomes
            ]
    # Every total is present, 0 included: a run with nothing to do still reports its totals.
    totals: dict[str, int] = defaultdict(int, {k: 0 for k in TOTAL_KEYS})
    rows = []
    stages: dict[str, dict[str, Any]] = {}
    for rec in records:
        for pk in rec.partitions:
            row = _partition_row(rec, pk)
            for k, v in row.items():
                if isinstance(v, int):
                    totals[k] += v
            for figures in row.get("stages", []):
                into = stages.setdefault(
                    str(figures["stage"]),
                    {"stage": figures["stage"], **dict.fromkeys(_STAGE_FIGURES, 0)},
                )
                for k in _STAGE_FIGURES:
                    into[k] += int(figures.get(k, 0))
            row["checks"] = checks.get(pk, [])
            row["blocking_failed"] = [
                c["name"] for c in row["checks"] if c["blocking"] and not c["passed"]
            ]
            row["applied"] = pk in applied
            row["status"] = "run"
            rows.append(row)
    rows.sort(key=lambda r: tuple(reversed(str(r["partition"]).split("|"))))
    failed = [r for r in records if not r.success]
    blocked = [r["partition"] for r in rows if r["blocking_failed"]]
    skipped = [
        {"partition": p.ref.key, "status": "skipped", "reason": p.reason}
        for p in (plan.skipped if plan is not None else [])
    ]
    return {
        "ok": not failed and not blocked,
        "skipped": skipped,
        "plan": {
            "partitions": len(plan.partitions) if plan is not None else len(rows),
            "runs": len(plan.boxes) if plan is not None else len(records),
            "to_run": sum(p.run for p in plan.partitions) if plan is not None else len(rows),
            "processes": processes,
            "asked_instance": len(plan.asked) if plan is not None else 0,
        },
        "runs": [
            {"run_id": r.run_id, "job": r.job, "success": r.success, "error": r.error}
            for r in records
        ],
        "partitions": rows,
        "blocked_partitions": blocked,
        "applied_partitions": len(applied),
        "totals": dict(totals),
        **({"stages": list(stages.values())} if stages else {}),
    }


def _checks_cell(checks: list[dict[str, Any]]) -> str:
    if not checks:
        return "-"
    failed = [c["name"] + ("!" if c["blocking"] else "") for c in checks if not c["passed"]]
    return "ok" if not failed else "FAIL " + ",".join(failed)


def human_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of the human table (check failures marked ``!`` when blocking)."""
    return [
        {**r, "checks": _checks_cell(r["checks"]), "applied": "yes" if r["applied"] else "no"}
        for r in doc["partitions"]
    ]


def totals_line(doc: dict[str, Any]) -> str:
    """One line under the table: the totals over all partitions and the failed runs."""
    totals = doc["totals"]
    failed = sum(1 for r in doc["runs"] if not r["success"])
    parts = [f"{k} {totals[k]:,}" for k in HUMAN_COLUMNS if isinstance(totals.get(k), int)]
    line = "totals: " + ", ".join([*parts, f"runs {len(doc['runs'])}", f"failed runs {failed}"])
    if totals.get("relabelled"):
        line += f"\nrelabelled from stored results: {totals['relabelled']:,} (no call made)"
    for f in doc.get("stages", []):
        line += (
            f"\nstage {f['stage']}: sent {f.get('sent', 0):,}, calls {f.get('calls', 0):,}, "
            f"decided {f.get('decided', 0):,}, cost ${usd_text(int(f.get('cost_nanos', 0)))}"
        )
    if totals.get("rerouted"):
        line += f"\nre-routed from stored results: {totals['rerouted']:,} (no call made)"
    return line


def skipped_line(doc: dict[str, Any]) -> str | None:
    """How many partitions were skipped, by reason (None if none were)."""
    reasons: dict[str, int] = defaultdict(int)
    for s in doc.get("skipped", []):
        reasons[s["reason"]] += 1
    if not reasons:
        return None
    shown = "; ".join(f"{n} {why}" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
    return f"skipped {sum(reasons.values())} partition(s): {shown}"


def by_tenant(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Human rows summed per tenant (for runs over many partitions)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        tenant = str(r["partition"]).split("|", 1)[1]
        agg = out.setdefault(tenant, {"partition": f"{tenant} (all)", "checks": "ok"})
        for k in HUMAN_COLUMNS:
            if isinstance(r.get(k), int):
                agg[k] = agg.get(k, 0) + r[k]
        if r["checks"] not in ("ok", "-"):
            agg["checks"] = "FAIL"
        agg["applied"] = "yes" if r["applied"] == "yes" and agg.get("applied") != "no" else "no"
    return [out[t] for t in sorted(out)]
