"""``GET /v1/organization/usage/completions`` and ``GET /v1/organization/costs`` for the
simulator's own traffic, in OpenAI's organization usage format (daily buckets).

Usage results are grouped by model (``group_by=model``, the only grouping served); costs are
one result per day, ``amount.value`` in USD from the meter's own prices.
Parameters: ``start_time`` (Unix seconds, required), ``end_time``, ``limit`` (buckets per page,
default 7, at most 31) and ``page`` (the cursor a previous page's ``next_page`` gave).
Chat and legacy completions (``/v1/completions``) count; moderation calls are left out of
both: they are no completions and cost nothing.
"""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qs

from backfill_assets.providersim.billing.meter import (
    CHAT_ENDPOINT,
    COMPLETIONS_ENDPOINT,
    BilledCall,
    MeterSnapshot,
)
from backfill_assets.providersim.wire import ApiError

_DAY = 86_400
_COMPLETION_ENDPOINTS = frozenset({CHAT_ENDPOINT, COMPLETIONS_ENDPOINT})


def _int(params: dict[str, list[str]], name: str, default: int | None) -> int:
    values = params.get(name)
    if not values:
        if default is None:
            raise ApiError(400, f"Missing required parameter: '{name}'.", param=name)
        return default
    try:
        return int(values[0])
    except ValueError:
        raise ApiError(400, f"Invalid '{name}': expected an integer.", param=name) from None


def _days(query: str) -> tuple[list[int], str | None]:
    """The bucket start times of this page, and the next page's cursor."""
    params = parse_qs(query)
    width = (params.get("bucket_width") or ["1d"])[0]
    if width != "1d":
        raise ApiError(400, "Only bucket_width=1d is served here.", param="bucket_width")
    start = _int(params, "start_time", None) // _DAY * _DAY
    end = _int(params, "end_time", start + 7 * _DAY)
    limit = min(max(_int(params, "limit", 7), 1), 31)
    first = start + _int(params, "page", 0) * _DAY
    days = list(range(first, min(end, first + limit * _DAY), _DAY))
    more = first + limit * _DAY < end
    return days, (str((first - start) // _DAY + limit) if more else None)


def _day_of(call: BilledCall) -> int:
    return int(call.billed_at) // _DAY * _DAY


def _completions(snapshot: MeterSnapshot) -> list[BilledCall]:
    return [call for call in snapshot.billed.values() if call.endpoint in _COMPLETION_ENDPOINTS]


def _page(buckets: list[dict[str, Any]], next_page: str | None) -> dict[str, Any]:
    return {
        "object": "page",
        "data": buckets,
        "has_more": next_page is not None,
        "next_page": next_page,
    }


def usage_page(snapshot: MeterSnapshot, query: str) -> dict[str, Any]:
    """One page of completions usage buckets, results grouped by model."""
    days, next_page = _days(query)
    sums: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for call in _completions(snapshot):
        row = sums[(_day_of(call), call.model)]
        row[0] += 1
        row[1] += call.prompt_tokens
        row[2] += call.cached_tokens
        row[3] += call.completion_tokens
    buckets = []
    for day in days:
        results = [
            {
                "object": "organization.usage.completions.result",
                "input_tokens": p,
                "output_tokens": o,
                "input_cached_tokens": c,
                "input_audio_tokens": 0,
                "output_audio_tokens": 0,
                "num_model_requests": n,
                "project_id": None,
                "user_id": None,
                "api_key_id": None,
                "model": model,
                "batch": None,
            }
            for (d, model), (n, p, c, o) in sorted(sums.items())
            if d == day
        ]
        buckets.append(_bucket(day, results))
    return _page(buckets, next_page)


def costs_page(snapshot: MeterSnapshot, query: str) -> dict[str, Any]:
    """One page of cost buckets: what the meter's own prices charged per day."""
    days, next_page = _days(query)
    nanos: dict[int, int] = defaultdict(int)
    for call in _completions(snapshot):
        nanos[_day_of(call)] += call.cost_nanos
    buckets = []
    for day in days:
        results = []
        if day in nanos:
            # A JSON number, as OpenAI sends it (the client reads it as a decimal, to the cent).
            value = float(Decimal(nanos[day]) / Decimal(10**9))
            results.append(
                {
                    "object": "organization.costs.result",
                    "amount": {"value": value, "currency": "usd"},
                    "line_item": None,
                    "project_id": None,
                }
            )
        buckets.append(_bucket(day, results))
    return _page(buckets, next_page)


def _bucket(day: int, results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "object": "bucket",
        "start_time": day,
        "end_time": day + _DAY,
        "results": results,
    }
