"""``run --sample N``: label a deterministic sample of each tenant's posts before the sweep.

The sample is the N posts whose work keys are smallest: a pure function of the posts and the
policy, so the same command picks the same posts, and the full run later finds their keys done
and pays for none of them again. The sample's label shares are set beside the live column's,
the comparison ``label_drift`` makes, so an operator learns what the new policy would flag
for the price of a few hundred posts.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine

from backfill_assets.defs.model_resources import ModelResource, versions_for
from backfill_assets.defs.partitions import partition_key_for
from backfill_assets.dispatch.partition_run import PartitionRef, RunOptions
from backfill_assets.dispatch.pipeline import run_partitions, with_levels
from backfill_assets.domain.checks.rules import DriftRule, drifted_labels
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.domain.work.keys import SLICE_KEYS, Versions, work_key
from backfill_assets.ledger.engine import read_tx
from backfill_assets.ledger.evaluations import answers
from backfill_assets.ledger.reports import live_label_counts
from backfill_assets.ledger.run.posts import content_hashes


@dataclass
class TenantSample:
    """One tenant's canary: the sample's label counts beside the live column's."""

    tenant: str
    posts: int
    sampled: int
    calls: int
    labels: dict[str, int]
    live: dict[str, int]
    drifted: list[str]
    table: str

    def as_dict(self) -> dict[str, Any]:
        """JSON form, with the shares."""
        total, live_total = sum(self.labels.values()), sum(self.live.values())
        return {
            "tenant": self.tenant,
            "posts": self.posts,
            "sampled": self.sampled,
            "calls": self.calls,
            "labels": dict(sorted(self.labels.items())),
            "shares": {k: v / total for k, v in sorted(self.labels.items())} if total else {},
            "live_labels": dict(sorted(self.live.items())),
            "live_shares": (
                {k: v / live_total for k, v in sorted(self.live.items())} if live_total else {}
            ),
            "drifted": self.drifted,
        }


def sample_ids(hashes: dict[str, str], tenant: str, versions: Versions, n: int) -> list[str]:
    """The ``n`` posts (of ``{post_id: content hash}``) with the smallest work keys."""
    keyed = sorted((work_key(versions, tenant, p, h), p) for p, h in hashes.items())
    return [p for _k, p in keyed[:n]]


def run_sample(
    engine: Engine,
    tenants: Sequence[str],
    n: int,
    rubric: Rubric,
    model: ModelResource,
    options: RunOptions,
    drift: DriftRule,
    log: Callable[[str], None] = lambda _m: None,
) -> list[TenantSample]:
    """Label each tenant's sample (keys already done are not sent again) and compare shares."""
    versions = versions_for(model, rubric)
    sync = dataclasses.replace(options, dispatch_mode="sync", batch=None)
    out: list[TenantSample] = []
    for tenant in tenants:
        with read_tx(engine) as conn:
            hashes = content_hashes(conn, tenant)
        chosen = sample_ids(hashes, tenant, versions, n)
        refs = with_levels(
            engine,
            [
                PartitionRef(partition_key_for(tenant, s), tenant, i)
                for i, s in enumerate(SLICE_KEYS)
            ],
        )
        reports = run_partitions(
            engine,
            [r for r in refs if r.slices],
            model.build_adapter,
            versions,
            rubric,
            f"sample-{uuid.uuid4().hex[:12]}",
            sync,
            log=log,
            only_posts=set(chosen),
        )
        with read_tx(engine) as conn:
            got = answers(conn, tenant, chosen, versions)
            live = live_label_counts(conn, [tenant], versions.code_version)[tenant]
        labels: dict[str, int] = {}
        for answer in got.values():
            if answer.label is not None:
                labels[answer.label] = labels.get(answer.label, 0) + 1
        live_total = sum(live.values())
        baseline = {k: v / live_total for k, v in live.items()} if live_total else {}
        flagged, table = drifted_labels(labels, baseline, drift)
        out.append(
            TenantSample(
                tenant=tenant,
                posts=len(hashes),
                sampled=len(chosen),
                calls=sum(r.stats.calls for r in reports),
                labels=labels,
                live=live,
                drifted=flagged if live_total else [],
                table=table,
            )
        )
    return out
