"""Usage per tenant, model and UTC day: the rollup the writer keeps, and the reports on it.

The ledger's usage events are the record; ``usage_daily`` (sql/008) sums them and grows in the
same transaction as the events (``add_usage``, called by the writer's outcome flush, the only
path that books usage). Reports read the rollup, so a refresh after a small run costs what
the tenants and days are, not what the ledger holds; ``verify`` compares the two per tenant
and model.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.domain.money.nanos import cached_share, cost_text
from backfill_assets.domain.work.events import EventKind
from backfill_assets.ledger.bulk import insert_values
from backfill_assets.ledger.tables import ledger_events, usage_daily

# (tenant, model) -> [calls, tokens_in, tokens_out, cost_nanos, tokens_cached, calls_cost_unknown]
UsageSums = tuple[tuple[str, str], Sequence[Any]]

_FIGURES = ("calls", "tokens_in", "tokens_out", "cost_nanos", "tokens_cached", "calls_cost_unknown")
_COLUMNS = ("tenant_id", "model", "day", *_FIGURES)
_ADD = "ON CONFLICT (tenant_id, model, day) DO UPDATE SET " + ", ".join(
    f"{c} = usage_daily.{c} + excluded.{c}" for c in _FIGURES
)


def add_usage(conn: Connection, day: str, sums: Sequence[UsageSums]) -> None:
    """Add one flush's usage events to the rollup (``sums`` sorted: no deadlock between runs).

    On the driver, as the flush's other inserts: a SQLAlchemy upsert per tenant cost ~2% of
    the pipeline's throughput (``bench/run pipeline``)."""
    values = [(tenant, model, day, *figures) for (tenant, model), figures in sums]
    insert_values(conn, usage_daily, _COLUMNS, values, _ADD)


def _row(*values: Any, day: str | None = None) -> dict[str, object]:
    tenant, model, calls, tokens_in, tokens_out, cost, cached, unknown = values
    return {
        "tenant": tenant,
        "model": model,
        **({"day": day} if day is not None else {}),
        "calls": int(calls),
        "tokens_in": int(tokens_in or 0),
        "tokens_out": int(tokens_out or 0),
        "tokens": int((tokens_in or 0) + (tokens_out or 0)),
        "tokens_cached": int(cached or 0),
        "cached_share": cached_share(int(cached or 0), int(tokens_in or 0)),
        "cost_nanos": int(cost or 0),
        # Calls of a model with no price (BACKFILL_ALLOW_UNPRICED): their cost is unknown.
        "calls_cost_unknown": int(unknown or 0),
        "cost_usd": cost_text(int(cost or 0), int(unknown or 0)),
    }


def usage_by_day(conn: Connection) -> list[dict[str, object]]:
    """Tokens, cost and calls per tenant, model and UTC day."""
    u = usage_daily
    stmt = sa.select(
        u.c.tenant_id,
        u.c.model,
        u.c.day,
        u.c.calls,
        u.c.tokens_in,
        u.c.tokens_out,
        u.c.cost_nanos,
        u.c.tokens_cached,
        u.c.calls_cost_unknown,
    ).order_by(u.c.tenant_id, u.c.model, u.c.day)
    return [
        _row(t, m, calls, t_in, t_out, cost, cached, unknown, day=str(day))
        for t, m, day, calls, t_in, t_out, cost, cached, unknown in conn.execute(stmt)
    ]


def usage_by_tenant_model(conn: Connection) -> list[dict[str, object]]:
    """Tokens, cost and calls per tenant and model."""
    u = usage_daily
    stmt = (
        sa.select(
            u.c.tenant_id,
            u.c.model,
            sa.func.sum(u.c.calls),
            sa.func.sum(u.c.tokens_in),
            sa.func.sum(u.c.tokens_out),
            sa.func.sum(u.c.cost_nanos),
            sa.func.sum(u.c.tokens_cached),
            sa.func.sum(u.c.calls_cost_unknown),
        )
        .group_by(u.c.tenant_id, u.c.model)
        .order_by(u.c.tenant_id, u.c.model)
    )
    return [_row(*r) for r in conn.execute(stmt)]


def billed_by_tenant() -> sa.Subquery:
    """``(tenant_id, n, nanos)``: tokens and nano-dollars billed per tenant, for joining into
    per-tenant reports."""
    u = usage_daily
    return (
        sa.select(
            u.c.tenant_id,
            sa.func.sum(u.c.tokens_in + u.c.tokens_out).label("n"),
            sa.func.sum(u.c.cost_nanos).label("nanos"),
        )
        .group_by(u.c.tenant_id)
        .subquery()
    )


def rollup_totals(conn: Connection, tenant_id: str) -> dict[str, tuple[int, int, int]]:
    """A tenant's rollup per model: calls, tokens in, tokens out (``verify`` compares them
    with the ledger rows it reads anyway)."""
    u = usage_daily
    stmt = (
        sa.select(
            u.c.model,
            sa.func.sum(u.c.calls),
            sa.func.sum(u.c.tokens_in),
            sa.func.sum(u.c.tokens_out),
        )
        .where(u.c.tenant_id == tenant_id)
        .group_by(u.c.model)
    )
    return {str(m): (int(c), int(i), int(o)) for m, c, i, o in conn.execute(stmt)}


def ledger_by_model_day(conn: Connection) -> list[tuple[str, str, int, int, int, int, int]]:
    """From the usage events themselves, not the rollup: ``(day, model, requests, tokens_in,
    tokens_cached, tokens_out, cost_nanos)`` over every tenant, for reconciling with the
    provider's report (which knows models and days, not tenants)."""
    e = ledger_events
    day = (
        sa.func.date(e.c.at)
        if conn.dialect.name == "sqlite"
        else sa.func.to_char(e.c.at, "YYYY-MM-DD")
    )
    stmt = (
        sa.select(
            day,
            e.c.model,
            sa.func.count(),
            sa.func.sum(e.c.tokens_in),
            sa.func.sum(e.c.tokens_cached),
            sa.func.sum(e.c.tokens_out),
            sa.func.sum(e.c.cost_nanos),
        )
        .where(e.c.type == EventKind.USAGE)
        .group_by(day, e.c.model)
        .order_by(day, e.c.model)
    )
    return [
        (str(d), str(m), int(n), int(i or 0), int(c or 0), int(o or 0), int(x or 0))
        for d, m, n, i, c, o, x in conn.execute(stmt)
    ]


UsageEvent = tuple[str, str, Any, str | None, str | None, int, int, int, int, int]


def usage_events(conn: Connection) -> Iterator[UsageEvent]:
    """Every usage event's tenant, model, day, tier, shape, tokens and booked cost, streamed
    (``usage --reprice`` prices each one again)."""
    e = ledger_events
    stmt = (
        sa.select(
            e.c.tenant_id,
            e.c.model,
            e.c.at,
            e.c.service_tier,
            e.c.usage_shape,
            e.c.tokens_in,
            e.c.tokens_cached,
            e.c.tokens_cache_written,
            e.c.tokens_out,
            e.c.cost_nanos,
        )
        .where(e.c.type == EventKind.USAGE)
        .execution_options(yield_per=10_000)
    )
    for row in conn.execute(stmt):
        yield tuple(row)
