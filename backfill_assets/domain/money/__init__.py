"""Money: nano-dollars, prices, budgets, reconciliation, deadline plans (pure).

The names the CLI uses are handed on here, so it imports the package, not its modules."""

from __future__ import annotations

from backfill_assets.domain.money.deadline import DeadlineError, DeadlinePlan, parse_deadline
from backfill_assets.domain.money.nanos import nanos_of_usd, usd, usd_text
from backfill_assets.domain.money.prices import Tier
from backfill_assets.domain.money.reconcile import ProviderReport, ReportError, compare, read_report

__all__ = [
    "DeadlineError",
    "DeadlinePlan",
    "ProviderReport",
    "ReportError",
    "Tier",
    "compare",
    "nanos_of_usd",
    "parse_deadline",
    "read_report",
    "usd",
    "usd_text",
]
