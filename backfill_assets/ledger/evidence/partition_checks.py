"""Check many partitions: evidence read in groups, the stored results' schema
validated in one frame per batch, each partition's check results from the pure rules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from backfill_assets.domain.checks.catalog import CheckResult
from backfill_assets.domain.checks.rules import CheckBounds, PartitionEvidence, evaluate
from backfill_assets.domain.policy.agreement import Pairs
from backfill_assets.domain.policy.output_gate import OutputContract
from backfill_assets.domain.policy.validation import stored_result_problems
from backfill_assets.domain.work.keys import Versions
from backfill_assets.ledger.engine import read_tx
from backfill_assets.ledger.evidence.evidence import Partition, evidence_of
from backfill_assets.ledger.run.partition_counts import post_counts
from backfill_assets.ledger.run.partition_groups import grouped_by_posts

Baseline = tuple[dict[str, float] | None, str]
# Rows (results + ledger) held for one schema frame: pandera's fixed cost per frame spread
# over many partitions, memory still bounded.
_BATCH_ROWS = 60_000


@dataclass(frozen=True)
class CheckSetup:
    """What a run's partitions are checked against: the code version, the output contract of
    its policy, the check bounds, the checks to evaluate, each tenant's drift baseline, the
    keys each partition deferred (by partition key) and how many sample keys a result names."""

    versions: Versions
    contract: OutputContract
    bounds: CheckBounds
    names: tuple[str, ...]
    baselines: Mapping[str, Baseline]
    deferred: Mapping[str, int | None]
    sample: int
    # A cascade's first stage and its gold share (``rules.PartitionEvidence.stage_share``).
    stage_share: tuple[str, float] | None = None
    # Each tenant's agreement pairs (``rules.PartitionEvidence.agreement``); None: not read.
    agreement: Mapping[str, Pairs] | None = None


def check_partitions(
    engine: Engine,
    partitions: Sequence[Partition],
    setup: CheckSetup,
    counts: Mapping[tuple[str, int], int] | None = None,
) -> dict[str, list[CheckResult]]:
    """Each partition's check results: rows read for a group of partitions at once
    (``partition_groups``), the stored-result schema validated in one frame per batch.
    ``counts``: posts per (tenant, slice) of their tenants, if the caller has read them.

    Memory is bounded by one batch (``_BATCH_ROWS`` rows, or one partition if larger), not by
    the run: a batch is checked and dropped before the next is read.
    """
    out: dict[str, list[CheckResult]] = {}
    batch: list[tuple[Partition, PartitionEvidence]] = []
    held = 0
    names = setup.names

    def check_batch() -> None:
        nonlocal batch, held
        if "output_schema" in names:
            _validate_stored([ev for _part, ev in batch], setup)
        for part, ev in batch:
            if part.tenant_id in setup.baselines:
                ev.baseline, ev.baseline_source = setup.baselines[part.tenant_id]
            ev.deferred = setup.deferred.get(part.key)
            ev.stage_share = setup.stage_share
            if setup.agreement is not None:
                ev.agreement = setup.agreement.get(part.tenant_id, {})
            out[part.key] = evaluate(ev, setup.bounds, names, sample=setup.sample)
        batch, held = [], 0

    with read_tx(engine) as conn:
        sizes = counts
        if sizes is None:
            sizes = post_counts(conn, sorted({part.tenant_id for part in partitions}))
        for group in grouped_by_posts(partitions, sizes):
            found = evidence_of(conn, group, setup.versions)
            for part in group:
                ev = found[part.key]
                batch.append((part, ev))
                held += len(ev.results) + len(ev.ledger)
            if held >= _BATCH_ROWS:
                check_batch()
    check_batch()
    return out


def _validate_stored(evidence: Sequence[PartitionEvidence], setup: CheckSetup) -> None:
    """Fill each partition's ``schema_problems`` from one frame over all their results."""
    unique = {r["key"]: r for ev in evidence for r in ev.results}
    bad: dict[str, list[str]] = {}
    rows = list(unique.values())
    for key, why in stored_result_problems(rows, setup.contract, setup.versions):
        bad.setdefault(key, []).append(why)
    for ev in evidence:
        ev.schema_problems = [(r["key"], why) for r in ev.results for why in bad.get(r["key"], [])]
