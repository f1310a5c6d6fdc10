"""The markdown tables ``policy_evaluation`` shows: every policy version's latest evaluation,
and one evaluation's per-label figures, confusion matrix and calibration."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from backfill_assets.domain.policy.evaluation import NO_LABEL
from backfill_assets.ledger import evaluations as evals


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _ci(x: Sequence[float] | None) -> str:
    return "-" if not x else f"{x[0]:.1%}-{x[1]:.1%}"


def per_label_table(report: dict[str, Any]) -> str:
    """Markdown: each label's precision, recall, F1 and support, with 95% Wilson intervals."""
    lines = [
        "| label | support | precision | 95% CI | recall | 95% CI | F1 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for f in report["labels"]:
        lines.append(
            f"| {f['label']} | {f['support']} | {_pct(f['precision'])} | "
            f"{_ci(f['precision_ci95'])} | {_pct(f['recall'])} | {_ci(f['recall_ci95'])} | "
            f"{f['f1']:.3f} |"
        )
    return "\n".join(lines)


def confusion_table(report: dict[str, Any]) -> str:
    """Markdown: expected label (rows) x answered label (columns)."""
    rows: dict[str, dict[str, int]] = report["confusion"]
    cols = [*next(iter(rows.values())).keys()] if rows else [NO_LABEL]
    lines = ["| expected \\ answered | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for label, row in rows.items():
        lines.append(f"| {label} | " + " | ".join(str(row[c]) for c in cols) + " |")
    return "\n".join(lines)


def calibration_table(report: dict[str, Any]) -> str:
    """Markdown: the expected calibration error overall and of each label the policy gave."""
    cal = report["calibration"]
    lines = [
        f"score: {cal['score']}",
        "",
        "| label | scored rows | ECE |",
        "|---|---:|---:|",
    ]
    for name, part in [("overall", cal["overall"]), *((c["label"], c) for c in cal["labels"])]:
        ece = "-" if part["ece"] is None else f"{part['ece']:.3f}"
        lines.append(f"| {name} | {part['rows']} | {ece} |")
    return "\n".join(lines)


def frontier_table(report: dict[str, Any]) -> str:
    """Markdown: a threshold sweep's frontier (``report["sweep"]``, as ``evaluate --cascade``
    recorded it), cheapest first, the chosen setting marked."""
    sweep = report["sweep"]
    names: list[str] = sweep["stages"]
    chosen = (sweep.get("chosen") or {}).get("setting")
    target = sweep.get("target_macro_f1")
    lines = [
        f"{Path(sweep['file']).name} on {Path(report['gold']['file']).name} "
        f"({report['rows']} rows): {sweep['settings']} settings swept, "
        + (f"target macro-F1 lower bound {target:g}" if target is not None else "no target"),
        "",
        "| setting | "
        + " | ".join(f"{n} decides" for n in names)
        + " | cost / 1k posts | macro-F1 [95% CI] | |",
        "|---|" + "---:|" * len(names) + "---:|---:|---|",
    ]
    for s in sweep["frontier"]:
        lo, hi = s["macro_f1_ci95"]
        mark = "chosen" if s["setting"] == chosen else ""
        lines.append(
            f"| {s['setting']} | "
            + " | ".join(_pct(s["decided"][n]) for n in names)
            + f" | {Decimal(s['cost_per_1000_posts_usd']):.6f} | "
            f"{s['macro_f1']:.3f} [{lo:.3f}, {hi:.3f}] | {mark} |"
        )
    return "\n".join(lines)


def evaluations_table(evaluations: Sequence[evals.Evaluation]) -> str:
    """Markdown: each policy version's latest evaluation."""
    lines = [
        "| policy | model | gold | rows | accuracy | macro-F1 | schema_rejected "
        "| cost / 1k posts |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for e in evaluations:
        lines.append(
            f"| {e.identity} | {e.model} | {Path(e.gold_source).name} | {e.gold_rows} | "
            f"{e.accuracy:.1%} | {e.macro_f1:.3f} | {e.schema_rejected_share:.1%} | "
            f"{Decimal(str(e.report.get('cost_per_1000_posts_usd', 0))):.6f} |"
        )
    if not evaluations:
        lines.append("| (none yet: `backfill-moderation evaluate GOLD`) | | | | | | | |")
    return "\n".join(lines)
