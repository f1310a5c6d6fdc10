"""The ledger against the provider's own usage report, per model and UTC day (pure).

The provider's report is OpenAI's organization usage format: pages of daily buckets from
``GET /v1/organization/usage/completions?bucket_width=1d&group_by=model`` (each result has
``model``, ``num_model_requests``, ``input_tokens``, ``input_cached_tokens`` and
``output_tokens``), optionally with pages of ``GET /v1/organization/costs`` buckets (results with
``amount.value`` in USD) for the money. Every figure is compared exactly; cost per day is
compared to the cent, half up, the precision the costs report is read at.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from backfill_assets.domain.money.nanos import NANOS_PER_USD, usd_rounded
from backfill_assets.domain.ranges import (
    MAX_NANOS,
    MAX_TOKENS,
    MAX_UNIX_SECONDS,
    OutOfRange,
    decimal_number,
    in_range,
    shown,
)

# The figures compared, as the ledger names them and as the report does.
FIELDS: Mapping[str, str] = {
    "requests": "num_model_requests",
    "tokens_in": "input_tokens",
    "tokens_cached": "input_cached_tokens",
    "tokens_out": "output_tokens",
}
_CENT = Decimal("0.01")
# A day's cost in a report, either way (a credit may be negative): the range of a budget.
MAX_USD = Decimal(MAX_NANOS // NANOS_PER_USD)


class ReportError(ValueError):
    """A usage report that cannot be read (the message names the page and bucket)."""


@dataclass(frozen=True, slots=True)
class Difference:
    """One figure of one model and day where the ledger and the provider disagree."""

    day: str
    model: str
    field: str
    ledger: str
    provider: str

    def line(self) -> str:
        """As printed: ``2026-12-04 gpt-4o-mini tokens_in: ledger 1200, provider 1180``."""
        where = f"{self.day} {self.model} {self.field}"
        return f"{where}: ledger {self.ledger}, provider {self.provider}"


@dataclass
class ProviderReport:
    """The report's figures per (day, model), and its cost per day when costs were given."""

    usage: dict[tuple[str, str], dict[str, int]]
    cost_by_day: dict[str, Decimal] | None


def _whole(digits: str) -> int:
    """A JSON integer, refused past 20 digits before Python's int() (which raises its own
    ValueError past 4,300)."""
    if len(digits.lstrip("-")) > 20:
        raise ReportError(f"a number of {len(digits.lstrip('-'))} digits")
    return int(digits)


def _json(text: str) -> Any:
    # Numbers as decimals (no float rounding), integers bounded.
    return json.loads(text, parse_float=Decimal, parse_int=_whole)


def _pages(text: str) -> list[Any]:
    """One page (a JSON object), a JSON list of pages, or JSON Lines of pages."""
    text = text.strip()
    if not text:
        raise ReportError("the report is empty")
    try:
        data = _json(text)
        return data if isinstance(data, list) else [data]
    except (json.JSONDecodeError, RecursionError):
        pass  # JSON Lines, or not JSON: each line says which
    pages = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            pages.append(_json(line))
        except json.JSONDecodeError as exc:
            raise ReportError(f"line {number}: not JSON ({exc.msg})") from None
        except RecursionError:
            raise ReportError(f"line {number}: nested deeper than a usage report is") from None
        except ReportError as exc:
            raise ReportError(f"line {number}: {exc}") from None
    return pages


def _count(result: Mapping[str, Any], name: str, where: str) -> int:
    value = result.get(name, 0)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ReportError(f"{where}: {name} is not a token count: {_shown(value)}")
    try:
        return in_range(value, 0, MAX_TOKENS, value)
    except OutOfRange as exc:
        raise ReportError(f"{where}: {name}: {exc}") from None


def _day(bucket: Mapping[str, Any], where: str) -> str:
    start = bucket.get("start_time")
    if isinstance(start, bool) or not isinstance(start, int):
        raise ReportError(f"{where}: start_time is not a Unix time: {_shown(start)}")
    try:
        in_range(start, 0, MAX_UNIX_SECONDS, start)
    except OutOfRange as exc:
        raise ReportError(f"{where}: start_time: {exc} (1970 to 9999)") from None
    return dt.datetime.fromtimestamp(start, dt.UTC).date().isoformat()


def _shown(value: object) -> str:
    """A value from the report in a message: its repr (control characters escaped), cut."""
    return shown(value) if isinstance(value, str) else shown(repr(value))


def read_report(text: str) -> ProviderReport:
    """The provider's usage (and costs) pages, summed per model and UTC day."""
    usage: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: dict.fromkeys(FIELDS, 0))
    costs: dict[str, Decimal] = defaultdict(Decimal)
    saw_costs = False
    for p, page in enumerate(_pages(text), start=1):
        buckets = page.get("data") if isinstance(page, dict) else None
        if not isinstance(buckets, list):
            raise ReportError(f"page {p}: expected an object with a 'data' list of buckets")
        for b, bucket in enumerate(buckets, start=1):
            where = f"page {p}, bucket {b}"
            if not isinstance(bucket, dict) or not isinstance(bucket.get("results"), list):
                raise ReportError(f"{where}: expected a bucket with a 'results' list")
            day = _day(bucket, where)
            for r, result in enumerate(bucket["results"], start=1):
                at = f"{where}, result {r}"
                if not isinstance(result, dict):
                    raise ReportError(f"{at}: expected an object")
                if result.get("object") == "organization.costs.result":
                    saw_costs = True
                    costs[day] += _amount(result, at)
                    continue
                model = result.get("model")
                if not isinstance(model, str) or not model:
                    raise ReportError(f"{at}: no model (export with group_by=model)")
                row = usage[(day, model)]
                for ours, theirs in FIELDS.items():
                    row[ours] += _count(result, theirs, at)
    return ProviderReport(dict(usage), dict(costs) if saw_costs else None)


def _amount(result: Mapping[str, Any], where: str) -> Decimal:
    amount = result.get("amount")
    value = amount.get("value") if isinstance(amount, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | Decimal | str):
        raise ReportError(f"{where}: amount.value is not a number: {_shown(value)}")
    try:
        return decimal_number(str(value), -MAX_USD, MAX_USD, "an amount in USD")
    except OutOfRange as exc:
        raise ReportError(f"{where}: amount.value: {exc}") from None


def compare(
    ledger: Iterable[tuple[str, str, int, int, int, int, int]], report: ProviderReport
) -> list[Difference]:
    """Every difference between the ledger's ``(day, model, requests, tokens_in,
    tokens_cached, tokens_out, cost_nanos)`` rows and the report, sorted by day and model."""
    ours: dict[tuple[str, str], dict[str, int]] = {}
    cost_by_day: dict[str, int] = defaultdict(int)
    for day, model, requests, tokens_in, cached, tokens_out, cost in ledger:
        ours[(day, model)] = {
            "requests": requests,
            "tokens_in": tokens_in,
            "tokens_cached": cached,
            "tokens_out": tokens_out,
        }
        cost_by_day[day] += cost
    found: list[Difference] = []
    zero = dict.fromkeys(FIELDS, 0)
    for day, model in sorted(set(ours) | set(report.usage)):
        mine, theirs = ours.get((day, model), zero), report.usage.get((day, model), zero)
        found += [
            Difference(day, model, f, str(mine[f]), str(theirs[f]))
            for f in FIELDS
            if mine[f] != theirs[f]
        ]
    if report.cost_by_day is not None:
        for day in sorted(set(cost_by_day) | set(report.cost_by_day)):
            mine_usd = usd_rounded(cost_by_day.get(day, 0), 2)
            theirs_usd = report.cost_by_day.get(day, Decimal(0)).quantize(
                _CENT, rounding=ROUND_HALF_UP
            )
            if mine_usd != theirs_usd:
                found.append(Difference(day, "*", "cost_usd", str(mine_usd), str(theirs_usd)))
    return found
