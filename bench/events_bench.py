"""Dagster's serialisation of an event against ``event_json``'s, side by side.

    bench/run events [--events N] [--repeat R]

Two events shaped like a small partition's: a ``moderation_labels`` materialisation with the
27 metadata entries a run attaches (counts, cost, two markdown tables, versions) and a check
group's evaluation. Each is serialised ``N`` times by ``serialize_value`` and by
``event_json`` (the same JSON value, checked first: Dagster reads ``event_json``'s text back to
an event it serialises to its own text), in turns; prints the median microseconds of ``R``
rounds, the ratio and both sizes, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import dagster as dg
from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData
from dagster._core.events.log import EventLogEntry

from backfill_assets.accelerators.dagster_private import serialize_value
from backfill_assets.accelerators.event_json import event_json
from bench.common import machine_speed, median

_TABLE = "| label | count | share |\n|---|---:|---:|\n| ok | 3 | 60.0% |\n| spam | 2 | 40.0% |"


def _entry(kind: DagsterEventType, data: Any, step: str) -> EventLogEntry:
    event = DagsterEvent(
        event_type_value=kind.value,
        job_name="moderation_backfill",
        event_specific_data=data,
        step_key=step,
        logging_tags={"job_name": "moderation_backfill", "op_name": step, "step_key": step},
    )
    return EventLogEntry(
        error_info=None,
        level="DEBUG",
        user_message="",
        run_id="0" * 36,
        timestamp=time.time(),
        step_key=step,
        job_name="moderation_backfill",
        dagster_event=event,
    )


def materialisation() -> EventLogEntry:
    """A labels materialisation with a small partition's 27 metadata entries."""
    counts = [
        "posts", "skipped_done", "pending_at_start", "in_open_batch", "model_calls", "retries",
        "rate_limited_429", "tokens_in", "tokens_out", "billed_tokens_total",
        "rebilled_tokens_total", "outcome_accepted", "outcome_schema_rejected",
        "outcome_retry_exhausted", "outcome_transport_rejected", "outcome_deferred",
    ]  # fmt: skip
    metadata: dict[str, Any] = {name: dg.MetadataValue.int(i) for i, name in enumerate(counts)}
    metadata |= {
        "cost_usd": dg.MetadataValue.text("0.000123000"),
        "label_distribution": dg.MetadataValue.md(_TABLE),
        "rule_distribution": dg.MetadataValue.md("| rule | label | count |\n|---|---|---:|"),
        "task_version": "moderation-2026.1",
        "prompt_version": "policy@d0f22620582d",
        "model": "fake-moderator-1",
        "policy": dg.MetadataValue.text("default@1#f26961e0a5c1f71e"),
        "policy_version": dg.MetadataValue.text("1"),
        "latency_p50_ms": dg.MetadataValue.float(0.03),
        "latency_p95_ms": dg.MetadataValue.float(0.04),
        "extra": dg.MetadataValue.int(1),
    }
    mat = dg.AssetMaterialization(
        asset_key="moderation_labels",
        partition="t00042",
        metadata=metadata,
        tags={"dagster/code_version": "v1"},
    )
    return _entry(DagsterEventType.ASSET_MATERIALIZATION, StepMaterializationData(mat), "labels")


def evaluation() -> EventLogEntry:
    """A check group's evaluation of one partition."""
    metadata = {f"integrity.{k}": i for i, k in enumerate(["expected", "results", "missing"])}
    evaluation = dg.AssetCheckEvaluation(
        asset_key=dg.AssetKey("moderation_labels"),
        check_name="integrity",
        passed=True,
        metadata={**metadata, "checks": dg.MetadataValue.md(_TABLE), "failed": "-"},
        severity=dg.AssetCheckSeverity.ERROR,
        description="all passed",
        blocking=True,
        partition="t00042",
    )
    return _entry(DagsterEventType.ASSET_CHECK_EVALUATION, evaluation, "checks")


def _us(fn: Callable[[Any], str], event: EventLogEntry, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn(event)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=2000, help="serialisations a round (2000)")
    ap.add_argument("--repeat", type=int, default=5, help="rounds, medians printed (5)")
    a = ap.parse_args()
    print(machine_speed())
    doc: dict[str, Any] = {}
    for name, event in (("materialisation", materialisation()), ("evaluation", evaluation())):
        theirs, ours_text = serialize_value(event), event_json(event)
        if serialize_value(dg.deserialize_value(ours_text, EventLogEntry)) != theirs:
            raise SystemExit(f"{name}: Dagster reads event_json's text as another event")
        dagster, ours = [], []
        for _ in range(a.repeat):
            dagster.append(_us(serialize_value, event, a.events))
            ours.append(_us(event_json, event, a.events))
        d, o = median(dagster), median(ours)
        print(
            f"{name}: serialize_value {d:.0f} us ({len(theirs):,} bytes), event_json"
            f" {o:.0f} us ({len(ours_text.encode()):,} bytes) ({o / d:.2f}x)"
        )
        doc[name] = {"serialize_value_us": d, "event_json_us": o, "ratio": o / d}
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
