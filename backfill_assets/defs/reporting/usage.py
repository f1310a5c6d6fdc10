"""Usage for invoicing: tokens, cost and calls per tenant, model and day, from the ledger."""

import csv
import io
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import dagster as dg
from sqlalchemy.engine import Connection

from backfill_assets.config.variables import StoreSettings
from backfill_assets.defs.asset_keys import LABELS
from backfill_assets.defs.sealing import NO_CONFIG
from backfill_assets.defs.sensors import refresh_condition
from backfill_assets.domain.csv_cells import csv_row
from backfill_assets.domain.money.nanos import cached_share, cost_text, usd_rounded, usd_text
from backfill_assets.domain.money.prices import PriceTable, Tier, event_cost
from backfill_assets.domain.policy.rubric import MAX_OUTPUT_TOKENS
from backfill_assets.ledger.engine import read_tx
from backfill_assets.ledger.engines import store_engine
from backfill_assets.ledger.run.usage import usage_by_day, usage_events

USAGE_COLUMNS = (
    "tenant",
    "model",
    "day",
    "calls",
    "tokens_in",
    "tokens_out",
    "tokens_cached",
    "cached_share",
    "tokens",
    "cost_usd",
)
# The metadata table is for reading in the UI; the CSV export has every row.
MAX_TABLE_ROWS = 100


def usage_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str] = USAGE_COLUMNS) -> str:
    """CSV text for invoicing, with a header row.

    ``cost_usd`` is in dollars with six decimals (rounded half up from the exact amount) and
    ``cost_nanos`` is the exact amount. After the rows, one ``TOTAL`` row per tenant (``model``
    is ``TOTAL``): its calls and tokens summed, and its ``cost_usd`` the exact sum of its
    nano-dollars rounded once to the cent, half up, never the sum of rounded rows. Text cells
    that a spreadsheet would run as a formula are quoted (``domain/csv_cells.py``)."""
    fields = [*columns, "cost_nanos"] if "cost_usd" in columns else list(columns)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    sums: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    figures = ("calls", "tokens_in", "tokens_out", "tokens_cached", "tokens", "cost_nanos")
    for r in rows:
        nanos = int(r["cost_nanos"])
        cost = _csv_cost(nanos, int(r.get("calls_cost_unknown") or 0), 6)
        writer.writerow(csv_row({**r, "cost_usd": cost, "cost_nanos": nanos}))
        t = sums[str(r["tenant"])]
        for name in (*figures, "calls_cost_unknown"):
            t[name] += int(r.get(name) or 0)
    for tenant, t in sorted(sums.items()):
        share = cached_share(t["tokens_cached"], t["tokens_in"])
        total = {**t, "tenant": tenant, "model": "TOTAL", "cached_share": share}
        cost = _csv_cost(t["cost_nanos"], t["calls_cost_unknown"], 2)
        writer.writerow(csv_row({**total, "cost_usd": cost}))
    return buf.getvalue()


def _csv_cost(nanos: int, unknown: int, places: int) -> str:
    """Dollars to ``places``, or ``unknown`` when any call of the row had no price."""
    return "unknown" if unknown else f"{usd_rounded(nanos, places)}"


def usage_markdown(rows: Sequence[dict[str, Any]], limit: int = MAX_TABLE_ROWS) -> str:
    """Markdown table of usage rows (the first ``limit``)."""
    lines = [
        "| tenant | model | day | calls | tokens | cost (USD) |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in rows[:limit]:
        lines.append(
            f"| {r['tenant']} | {r['model']} | {r['day']} | {r['calls']} | {r['tokens']} "
            f"| {r['cost_usd']} |"
        )
    if len(rows) > limit:
        lines.append(f"| ... {len(rows) - limit} more row(s): `backfill-moderation usage --csv` |")
    if not rows:
        lines.append("| (no usage yet) | | | | | |")
    return "\n".join(lines)


def tenant_totals(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Calls, tokens and nano-dollars per tenant over all models and days."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: {"calls": 0, "tokens": 0, "cost_nanos": 0})
    for r in rows:
        t = out[str(r["tenant"])]
        t["calls"] += int(r["calls"])
        t["tokens"] += int(r["tokens"])
        t["cost_nanos"] += int(r["cost_nanos"])
    return dict(out)


REPRICE_COLUMNS = ("tenant", "model", "calls", "booked_usd", "today_usd", "difference_usd")


def reprice(conn: Connection, table: PriceTable) -> list[dict[str, Any]]:
    """Per tenant and model: what the usage events were booked at, and what they would cost
    under ``table`` today (each event priced again, at its own tier; events booked before
    tiers were recorded count as standard)."""
    sums: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for tenant, model, _at, tier, shape, t_in, cached, written, t_out, cost in usage_events(conn):
        row = sums[(tenant, model)]
        row[0] += 1
        row[1] += int(cost)
        row[2] += event_cost(
            table,
            model,
            Tier(tier) if tier else Tier.STANDARD,
            shape,
            (int(t_in), int(cached), int(written), int(t_out)),
            MAX_OUTPUT_TOKENS,
        )
    return [
        {
            "tenant": tenant,
            "model": model,
            "calls": calls,
            "booked_usd": usd_text(booked),
            "today_usd": usd_text(today),
            "difference_usd": usd_text(today - booked),
        }
        for (tenant, model), (calls, booked, today) in sorted(sums.items())
    ]


@dg.asset(
    config_schema=NO_CONFIG,
    group_name="reporting",
    deps=[LABELS],
    kinds={"sql"},
    # Refreshed by the daemon whenever labels were materialised (and by `run` itself), so a
    # user opening it after a backfill sees current figures.
    automation_condition=refresh_condition(),
)
def tenant_usage(store: dg.ResourceParam[StoreSettings]) -> dg.MaterializeResult[None]:
    """Tokens, cost and calls per tenant, model and day (the invoice's source)."""
    with read_tx(store_engine(store)) as conn:
        rows = usage_by_day(conn)
    totals = tenant_totals(rows)
    cost = sum(t["cost_nanos"] for t in totals.values())
    unknown = sum(int(str(r["calls_cost_unknown"])) for r in rows)
    return dg.MaterializeResult(
        metadata={
            "usage": dg.MetadataValue.md(usage_markdown(rows)),
            "rows": dg.MetadataValue.int(len(rows)),
            "tenants": dg.MetadataValue.int(len(totals)),
            "calls": dg.MetadataValue.int(sum(int(t["calls"]) for t in totals.values())),
            "tokens": dg.MetadataValue.int(sum(int(t["tokens"]) for t in totals.values())),
            "cost_usd": dg.MetadataValue.text(cost_text(cost, unknown)),
            "calls_cost_unknown": dg.MetadataValue.int(unknown),
            "export": dg.MetadataValue.md("`backfill-moderation usage --csv > usage.csv`"),
        }
    )
