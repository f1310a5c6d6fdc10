"""What one outcome flush books: its staged rows, and the spend it moves in the same transaction.

Billed tokens move from the reservation to the tenant's total with the usage events, so billed
plus reserved never drops below real spend.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.domain.money.budgets import Spend
from backfill_assets.ledger.engine import is_sqlite
from backfill_assets.ledger.run.rows import DeadRow, EventRow, ResultRow
from backfill_assets.ledger.run.usage import add_usage
from backfill_assets.ledger.tables import batch_submissions, budget_reservations, tenants, utcnow


@dataclass
class Staged:
    """The rows and spend one outcome flush commits together."""

    events: list[EventRow] = field(default_factory=list)
    results: list[ResultRow] = field(default_factory=list)
    dead: list[DeadRow] = field(default_factory=list)
    # reservation id -> billed tokens and nanos to take off it (they now count as spent).
    unreserve: dict[str, Spend] = field(default_factory=lambda: defaultdict(Spend))
    billed: dict[str, Spend] = field(default_factory=lambda: defaultdict(Spend))
    released: dict[str, Spend] = field(default_factory=lambda: defaultdict(Spend))
    # (tenant, model) -> [calls, tokens_in, tokens_out, cost_nanos, tokens_cached,
    # calls_cost_unknown] of the staged usage events.
    usage: dict[tuple[str, str], list[Any]] = field(default_factory=dict)
    first_at: float | None = None

    def empty(self) -> bool:
        return not (self.events or self.results or self.dead)

    def rows(self) -> int:
        return len(self.results) + len(self.dead)


# A flush's billed tokens onto each tenant's total.
_BILL = (
    tenants.update()
    .where(tenants.c.tenant_id == sa.bindparam("b_tenant"))
    .values(
        billed_tokens=tenants.c.billed_tokens + sa.bindparam("b_tokens"),
        billed_nanos=tenants.c.billed_nanos + sa.bindparam("b_nanos"),
    )
)
# PostgreSQL: the tenants' rows locked in sorted order first (ORDER BY sits below the row
# locks), then one UPDATE over arrays. An executemany is a statement a row on the server,
# parsed and planned each: 10,000 of them a run of 10,000 small tenants.
_LOCK_BILLED_PG = sa.text(
    "SELECT tenant_id FROM tenants WHERE tenant_id = ANY(CAST(:tenants AS TEXT[]))"
    " ORDER BY tenant_id FOR UPDATE"
)
_BILL_PG = sa.text(
    "UPDATE tenants SET billed_tokens = tenants.billed_tokens + u.tokens,"
    " billed_nanos = tenants.billed_nanos + u.nanos"
    " FROM unnest(CAST(:tenants AS TEXT[]), CAST(:tokens AS BIGINT[]),"
    " CAST(:nanos AS BIGINT[])) AS u(tenant, tokens, nanos)"
    " WHERE tenants.tenant_id = u.tenant"
)


def book_spend(conn: Connection, s: Staged, day: str) -> None:
    """Move a flush's billed spend from reservations to the tenants' totals and the rollup."""
    # Billed tokens move from the reservation to the tenant's total in the same
    # transaction as the usage events, so billed + reserved never drops below real spend;
    # the usage rollup (sql/008) grows by the same events, so it always equals the ledger.
    # Rows are updated in sorted order: two runs flushing for the same tenants (different
    # partitions) in different orders deadlocked on PostgreSQL, failing one run's step.
    if s.usage:
        add_usage(conn, day, sorted(s.usage.items()))
    if s.billed:
        billed = sorted(s.billed.items())  # one entry a tenant: its flush's sum
        if not is_sqlite(conn.engine):
            names = [t for t, _spent in billed]
            conn.execute(_LOCK_BILLED_PG, {"tenants": names})
            conn.execute(
                _BILL_PG,
                {
                    "tenants": names,
                    "tokens": [spent.tokens for _t, spent in billed],
                    "nanos": [spent.nanos for _t, spent in billed],
                },
            )
        else:
            # One executemany, in that order (a statement built each tenant was 7% of a
            # run of 10,000 small tenants).
            conn.execute(
                _BILL,
                [
                    {"b_tenant": t, "b_tokens": spent.tokens, "b_nanos": spent.nanos}
                    for t, spent in billed
                ],
            )
    for rid, spent in sorted(s.unreserve.items()):
        conn.execute(
            budget_reservations.update()
            .where(budget_reservations.c.reservation_id == rid)
            .values(
                tokens=budget_reservations.c.tokens - spent.tokens,
                nanos=budget_reservations.c.nanos - spent.nanos,
                heartbeat_at=utcnow(),
            )
        )
    for chunk_id, bound in sorted(s.released.items()):
        conn.execute(
            batch_submissions.update()
            .where(batch_submissions.c.chunk_id == chunk_id)
            .values(
                reserved_tokens=batch_submissions.c.reserved_tokens - bound.tokens,
                reserved_nanos=batch_submissions.c.reserved_nanos - bound.nanos,
            )
        )
