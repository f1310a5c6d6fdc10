"""Turn partition reports into Dagster metadata (one place, not in every asset)."""

from __future__ import annotations

from typing import Any

import dagster as dg

from backfill_assets.core.keys import Versions
from backfill_assets.dispatch.partition_run import PartitionReport


def label_table(labels: dict[str, int]) -> str:
    """Markdown table of a label distribution."""
    total = sum(labels.values())
    lines = ["| label | count | share |", "|---|---:|---:|"]
    for label, n in sorted(labels.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"| {label} | {n} | {n / total:.1%} |" if total else f"| {label} | {n} | - |")
    if total == 0:
        lines.append("| (none) | 0 | - |")
    return "\n".join(lines)


def partition_metadata(
    rep: PartitionReport, versions: Versions, spend: dict[str, int] | None = None
) -> dict[str, Any]:
    """Metadata of one partition's materialisation; ``spend`` is the partition's ledger view."""
    s = rep.summary()
    out: dict[str, Any] = {
        "posts": dg.MetadataValue.int(s["posts"]),
        "skipped_done": dg.MetadataValue.int(s["skipped"]),
        "pending_at_start": dg.MetadataValue.int(s["pending"]),
        "in_open_batch": dg.MetadataValue.int(s["in_open_batch"]),
        "model_calls": dg.MetadataValue.int(s["calls"]),
        "retries": dg.MetadataValue.int(s["retries"]),
        "rate_limited_429": dg.MetadataValue.int(s["rate_limited"]),
        "tokens_in": dg.MetadataValue.int(s["tokens_in"]),
        "tokens_out": dg.MetadataValue.int(s["tokens_out"]),
        "cost_usd": dg.MetadataValue.float(float(s["cost"])),
        "label_distribution": dg.MetadataValue.md(label_table(s["labels_total"])),
        "task_version": versions.task_version,
        "prompt_version": versions.prompt_version,
        "model": versions.model,
    }
    if spend is not None:
        # Over the partition's whole ledger, not just this run: what the tenant was billed.
        out["billed_tokens_total"] = dg.MetadataValue.int(spend["billed_tokens"])
        out["rebilled_tokens_total"] = dg.MetadataValue.int(spend["rebilled_tokens"])
    for outcome, n in s["outcomes"].items():
        out[f"outcome_{outcome}"] = dg.MetadataValue.int(int(n))
    if s["latency_p95_ms"] is not None:
        out["latency_p50_ms"] = dg.MetadataValue.float(float(s["latency_p50_ms"]))
        out["latency_p95_ms"] = dg.MetadataValue.float(float(s["latency_p95_ms"]))
    return out
