"""``verify``: every tenant's rows proven against its posts, the usage rollup against the
ledger, and (with a sink) the partitions not yet written back; the CLI's report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.domain.checks.verify import (
    BLOCKING_KINDS,
    Booked,
    Problem,
    ScopeReport,
    book_usage,
    usage_rollup_problems,
    verify_scope,
)
from backfill_assets.domain.work.keys import Versions, slice_key
from backfill_assets.ledger.engine import whole_table_read_tx
from backfill_assets.ledger.evidence.evidence import CHUNK_POSTS, tenant_chunks
from backfill_assets.ledger.run.usage import rollup_totals
from backfill_assets.ledger.tables import dead_letters, ledger_events, results, tenants, usage_daily
from backfill_assets.platform_db.sink import Sink, gap_partitions


@dataclass
class VerifyReport:
    """Everything ``verify`` reports."""

    reports: list[ScopeReport]
    problems: list[Problem]
    # With a sink: its name, and the partitions (tenant, partition key) whose applied labels
    # are not all written back there yet.
    sink: str | None = None
    sink_pending: list[tuple[str, str]] = field(default_factory=list)

    def blocking(self, require_complete: bool) -> bool:
        """True when the outcome must fail the command or check."""
        if any(p.kind in BLOCKING_KINDS for p in self.problems):
            return True
        return require_complete and (
            any(r.missing for r in self.reports if not r.evaluation) or bool(self.sink_pending)
        )

    def as_dict(self, require_complete: bool = False, max_problems: int = 200) -> dict[str, Any]:
        """The ``verify --json`` document."""
        problems = [
            {"kind": p.kind, "tenant": p.tenant, "table": p.table, "key": p.key, "detail": p.detail}
            for p in self.problems[:max_problems]
        ]
        if require_complete:
            problems += [
                {
                    "kind": "missing",
                    "tenant": r.tenant,
                    "table": "results",
                    "key": k,
                    "detail": f"{r.missing} expected key(s) neither accepted nor dead-lettered",
                }
                for r in self.reports
                if r.missing and not r.evaluation
                for k in r.missing_keys[:1]
            ]
        problems += [
            {
                "kind": "sink_pending",
                "tenant": tenant,
                "table": "sink",
                "key": partition,
                "detail": f"applied in the store, not yet written back to {self.sink}",
            }
            for tenant, partition in self.sink_pending[:max_problems]
        ]
        doc: dict[str, Any] = {
            "ok": not self.blocking(require_complete),
            "problems": problems,
            "problems_total": len(self.problems) + len(self.sink_pending),
            "tenants": [r.as_dict() for r in self.reports],
        }
        if self.sink is not None:
            doc["sink"] = {"name": self.sink, "pending_partitions": len(self.sink_pending)}
        return doc


def verify_store(
    engine: Engine,
    versions: Versions,
    tenant_filter: Sequence[str] | None = None,
    sink: Sink | None = None,
    chunk_posts: int = CHUNK_POSTS,
) -> VerifyReport:
    """Verify every tenant that has posts or claims rows (and, with ``sink``, which of their
    partitions are applied in the store but not yet written back), ``chunk_posts`` posts of a
    tenant at a time."""
    reports: list[ScopeReport] = []
    problems: list[Problem] = []
    with whole_table_read_tx(engine) as conn:
        names: set[str] = set()
        for table in (tenants, results, dead_letters, ledger_events, usage_daily):
            names.update(
                str(t) for t in conn.execute(sa.select(table.c.tenant_id).distinct()).scalars()
            )
        if tenant_filter:
            names &= set(tenant_filter)
        gold = set(
            conn.execute(
                sa.select(tenants.c.tenant_id).where(tenants.c.purpose.is_not(None))
            ).scalars()
        )
        for tenant_id in sorted(names):
            rep = ScopeReport(tenant=tenant_id, evaluation=tenant_id in gold)
            booked: Booked = {}
            for rows in tenant_chunks(conn, tenant_id, chunk_posts):
                part, probs = verify_scope(
                    tenant_id, rows.posts, rows.results, rows.dead, rows.ledger, versions
                )
                rep.absorb(part)
                problems.extend(probs)
                book_usage(booked, tenant_id, rows.ledger)
            reports.append(rep)
            rollup = rollup_totals(conn, tenant_id)
            problems.extend(usage_rollup_problems(tenant_id, booked, rollup))
        pending: list[tuple[str, str]] = []
        if sink is not None:
            found = gap_partitions(conn, sink.sink_id, versions.key_version, tenant_filter or None)
            pending = sorted((t, slice_key(n)) for t, n, _level in found)
    return VerifyReport(
        reports=reports,
        problems=problems,
        sink=None if sink is None else sink.name,
        sink_pending=pending,
    )
