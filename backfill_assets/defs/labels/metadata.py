"""Turn partition reports into Dagster metadata (one place, not in every asset)."""

from __future__ import annotations

import functools
from typing import Any

import dagster as dg

from backfill_assets.dispatch.partition_run import PartitionReport
from backfill_assets.domain.money.nanos import usd_text
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.domain.work.keys import Versions


@functools.lru_cache(maxsize=4096, typed=True)
def int_value(n: int) -> dg.IntMetadataValue:
    """``MetadataValue.int(n)``, made once per value. Dagster's checked constructor (or its
    normalising of a plain ``int``) is ~3 us, paid ~40 times a small partition; the values
    are immutable, so events may share them."""
    return dg.MetadataValue.int(n)


@functools.lru_cache(maxsize=256)
def text_value(text: str) -> dg.TextMetadataValue:
    """``MetadataValue.text(text)``, made once per text: for the texts every partition of a
    run repeats (versions, policy)."""
    return dg.MetadataValue.text(text)


def label_table(labels: dict[str, int]) -> str:
    """Markdown table of a label distribution."""
    total = sum(labels.values())
    lines = ["| label | count | share |", "|---|---:|---:|"]
    for label, n in sorted(labels.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"| {label} | {n} | {n / total:.1%} |" if total else f"| {label} | {n} | - |")
    if total == 0:
        lines.append("| (none) | 0 | - |")
    return "\n".join(lines)


def stage_table(stages: list[dict[str, Any]]) -> str:
    """Markdown table of a cascade's stages in one partition: posts sent and calls this run,
    their cost, and the share of the partition's labels each stage decided (all runs)."""
    decided = sum(f.get("decided", 0) for f in stages)
    lines = [
        "| stage | sent | calls | cost_usd | decided | share |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for f in stages:
        n = f.get("decided", 0)
        share = f"{n / decided:.1%}" if decided else "-"
        lines.append(
            f"| {f['stage']} | {f.get('sent', 0)} | {f.get('calls', 0)} | "
            f"{usd_text(f.get('cost_nanos', 0))} | {n} | {share} |"
        )
    return "\n".join(lines)


def rule_table(rules: dict[str, int], rubric: Rubric) -> str:
    """Markdown table of the rules that matched, with the label each leads to."""
    lines = ["| rule | label | count |", "|---|---|---:|"]
    for rule, n in sorted(rules.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"| {rule} | {rubric.contract.rule_label(rule) or '-'} | {n} |")
    if not rules:
        lines.append("| (none) | | 0 |")
    return "\n".join(lines)


def partition_metadata(
    rep: PartitionReport,
    versions: Versions,
    rubric: Rubric,
    spend: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Metadata of one partition's materialisation; ``spend`` is the partition's ledger view."""
    s = rep.summary()
    out: dict[str, Any] = {
        "posts": int_value(s["posts"]),
        "skipped_done": int_value(s["skipped"]),
        "pending_at_start": int_value(s["pending"]),
        "in_open_batch": int_value(s["in_open_batch"]),
        "model_calls": int_value(s["calls"]),
        "retries": int_value(s["retries"]),
        "rate_limited_429": int_value(s["rate_limited"]),
        "tokens_in": int_value(s["tokens_in"]),
        "tokens_out": int_value(s["tokens_out"]),
        "cost_usd": dg.MetadataValue.text(str(s["cost_usd"])),
        "label_distribution": dg.MetadataValue.md(label_table(s["labels_total"])),
        "rule_distribution": dg.MetadataValue.md(rule_table(s["rules_total"], rubric)),
        "task_version": text_value(versions.task_version),
        "prompt_version": text_value(versions.key_version),
        "model": text_value(versions.model),
        "policy": text_value(rubric.policy.identity),
        "policy_version": text_value(rubric.policy.version),
    }
    if spend is not None:
        # Over the partition's whole ledger, not just this run: what the tenant was billed.
        out["billed_tokens_total"] = int_value(spend["billed_tokens"])
        out["rebilled_tokens_total"] = int_value(spend["rebilled_tokens"])
    for outcome, n in s["outcomes"].items():
        out[f"outcome_{outcome}"] = int_value(int(n))
    # Labels re-read from stored answers under a changed mapping: no call was made for them.
    out["relabelled_from_stored"] = int_value(s["relabelled"])
    if s["stages"]:
        # A cascade: what each stage was sent, cost and decided; labels re-routed by a changed
        # decide rule without a call.
        out["rerouted_from_stored"] = int_value(s["rerouted"])
        out["stages"] = dg.MetadataValue.json(s["stages"])
        out["stage_distribution"] = dg.MetadataValue.md(stage_table(s["stages"]))
    # How sure the model was of the labels this run accepted, where the wire said (p_label).
    out["p_label_known"] = int_value(s["p_label_known"])
    if s["p_label_mean"] is not None:
        out["p_label_mean"] = dg.MetadataValue.float(float(s["p_label_mean"]))
    if s["latency_p95_ms"] is not None:
        out["latency_p50_ms"] = dg.MetadataValue.float(float(s["latency_p50_ms"]))
        out["latency_p95_ms"] = dg.MetadataValue.float(float(s["latency_p95_ms"]))
    return out
