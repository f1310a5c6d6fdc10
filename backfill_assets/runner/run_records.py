"""What a finished in-process run did, read back from its events: the partitions it
materialised and applied, each partition's recorded checks, and why it failed."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from backfill_assets.defs.asset_keys import APPLIED, LABELS

# Dagster raises this inside a step when the process gets SIGTERM or SIGINT: such a run is
# recorded as interrupted (canceled), not failed.
_INTERRUPTED = "DagsterExecutionInterruptedError"


@dataclass(frozen=True)
class RecordedCheck:
    """One check's evaluation of one partition in one run."""

    name: str
    passed: bool
    blocking: bool
    severity: str
    summary: str | None


@dataclass
class RunRecord:
    """One in-process Dagster run and what it materialised.

    ``partitions`` and ``metadata`` are moderation_labels'; ``applied`` lists the partitions
    applied_labels materialised, ``checks`` each partition's check outcomes.
    """

    run_id: str
    success: bool
    partitions: list[str]
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: str | None = None
    checks: dict[str, list[RecordedCheck]] = field(default_factory=dict)
    applied: list[str] = field(default_factory=list)
    job: str = ""
    # SIGTERM/SIGINT stopped the run (it is recorded as canceled, not failed).
    interrupted: bool = False

    def as_doc(self) -> dict[str, Any]:
        """The record as JSON values, for another process (``from_doc`` reads it back).

        Built field by field: ``dataclasses.asdict`` deep-copies every value, ~0.2 ms a
        partition, which a run helper paid for its 5,000 partitions after its last run."""
        doc = dict(vars(self))
        doc["checks"] = {pk: [vars(c) for c in cs] for pk, cs in self.checks.items()}
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> RunRecord:
        """The record ``as_doc`` wrote."""
        checks = {pk: [RecordedCheck(**c) for c in cs] for pk, cs in doc["checks"].items()}
        return cls(**{**doc, "checks": checks})

    def blocked(self) -> dict[str, list[str]]:
        """Partitions with failed blocking checks, and which."""
        out: dict[str, list[str]] = {}
        for pk, outcomes in self.checks.items():
            names = [c.name for c in outcomes if c.blocking and not c.passed]
            if names:
                out[pk] = names
        return out


def _metadata_value(value: Any) -> Any:
    return getattr(value, "value", value)


@functools.lru_cache(maxsize=256)
def _parsed(raw: str) -> tuple[dict[str, Any], ...]:
    """``checks_json`` parsed, once per text: a run's evaluations mostly share one."""
    try:
        return tuple(json.loads(raw))
    except json.JSONDecodeError:
        return ()


def _members(evaluation: dg.AssetCheckEvaluation) -> list[RecordedCheck]:
    """A group evaluation's member checks, from the JSON list in its metadata."""
    raw = _metadata_value(evaluation.metadata.get("checks_json"))
    members = _parsed(raw) if isinstance(raw, str) else ()
    return [
        RecordedCheck(
            name=str(m["name"]),
            passed=bool(m["passed"]),
            blocking=bool(m["blocking"]),
            severity="WARN" if m.get("warn") else "ERROR",
            summary=evaluation.description if not m["passed"] else None,
        )
        for m in members
    ]


def record_of(result: dg.ExecuteInProcessResult, job_name: str) -> RunRecord:
    """What a finished in-process run materialised, checked and applied, or why it failed."""
    rec = RunRecord(run_id=result.run_id, success=result.success, partitions=[], job=job_name)
    for ev in result.get_asset_materialization_events():
        mat = ev.event_specific_data.materialization  # type: ignore[union-attr]
        if mat is None or mat.partition is None:
            continue
        pk = str(mat.partition)
        if mat.asset_key == APPLIED:
            rec.applied.append(pk)
        elif mat.asset_key == LABELS:
            rec.partitions.append(pk)
            rec.metadata[pk] = {k: _metadata_value(v) for k, v in mat.metadata.items()}
    for evaluation in result.get_asset_check_evaluations():
        if evaluation.partition is None:
            continue
        rec.checks.setdefault(evaluation.partition, []).extend(_members(evaluation))
    if not result.success:
        failures = [e for e in result.all_events if e.is_failure]
        rec.error = _failure_text(failures[0]) if failures else "run failed"
        rec.interrupted = any(_INTERRUPTED in str(e.event_specific_data) for e in failures)
    return rec


def _failure_text(event: dg.DagsterEvent) -> str:
    """The step's failure message plus the asset's ``dg.Failure`` description, which says why
    (e.g. the region without an endpoint); the message alone only names the step."""
    user = getattr(event.event_specific_data, "user_failure_data", None)
    description = getattr(user, "description", None)
    message = event.message or "run failed"
    return f"{message} {description}" if description else message
