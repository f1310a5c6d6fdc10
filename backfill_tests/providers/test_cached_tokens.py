"""Prompt caching as providers bill it: cached tokens read from OpenAI's
``prompt_tokens_details`` and from Anthropic-shaped usage through gateways, booked per call,
and priced at the cached rate, so the ledger's cost is the provider's bill to the nano-dollar."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.dispatch.pipeline import RunOptions, run_partitions
from backfill_assets.domain.money.prices import PriceTable, Tier
from backfill_assets.providers.models.openai_wire import billed_usage
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import refs_for
from backfill_tests.providers.conftest import RUBRIC, VERSIONS, AdapterFactory, StartSim

PRICES = PriceTable.from_json("")


@pytest.mark.parametrize(
    ("usage", "figures"),
    [
        (  # OpenAI: cached is part of prompt_tokens
            {
                "prompt_tokens": 2000,
                "completion_tokens": 20,
                "total_tokens": 2020,
                "prompt_tokens_details": {"cached_tokens": 1792},
            },
            (2000, 20, 1792, 0),
        ),
        (  # Anthropic through a gateway: input_tokens leaves the cache out
            {
                "input_tokens": 208,
                "output_tokens": 20,
                "cache_read_input_tokens": 1792,
                "cache_creation_input_tokens": 0,
            },
            (2000, 20, 1792, 0),
        ),
        (  # a first call writes the cache
            {"input_tokens": 8, "output_tokens": 20, "cache_creation_input_tokens": 1992},
            (2000, 20, 0, 1992),
        ),
        (  # vLLM and others: details null
            {"prompt_tokens": 50, "completion_tokens": 5, "prompt_tokens_details": None},
            (50, 5, 0, 0),
        ),
        (  # a cached count the prompt cannot hold is cut to the prompt
            {
                "prompt_tokens": 50,
                "completion_tokens": 5,
                "prompt_tokens_details": {"cached_tokens": 10**6},
            },
            (50, 5, 50, 0),
        ),
    ],
)
def test_cached_tokens_are_read_from_every_shape(
    usage: dict[str, object], figures: tuple[int, int, int, int]
) -> None:
    got = billed_usage(usage)
    assert got is not None
    assert (got.tokens_in, got.tokens_out, got.cached, got.cache_written) == figures


def test_cached_tokens_cost_the_cached_price() -> None:
    # gpt-4o-mini: $0.15 in, $0.075 cached in, $0.60 out per million.
    assert PRICES.cost("gpt-4o-mini", 1000, 100, cached=800) == 200 * 150 + 800 * 75 + 100 * 600
    assert PRICES.cost("gpt-4o-mini", 1000, 100, cached=800, tier=Tier.BATCH) == 75_000
    # Without a cached price (a custom model), cached tokens cost the input price.
    table = PriceTable.from_json('{"own": {"input": 1, "output": 1}}')
    assert table.cost("own", 1000, 0, cached=1000) == table.cost("own", 1000, 0)


@pytest.mark.parametrize("shape", ["full", "anthropic"])
def test_the_ledger_books_the_cached_bill_call_by_call(
    shape: str,
    engine: Engine,
    tmp_path: Path,
    start_sim: StartSim,
    adapter_for: AdapterFactory,
) -> None:
    # Long posts, so each prompt passes the 1,024 tokens a provider caches from.
    text = "order 1234 arrived late and the box was damaged, please refund. " * 90
    import_records(
        engine,
        tmp_path,
        [{"tenant_id": "acme", "post_id": f"p{i}", "text": f"{i} {text}"} for i in range(12)],
    )
    sim = start_sim(usage_shape=shape, cached_prefix_tokens=1200)
    run_partitions(
        engine,
        refs_for(["acme"]),
        adapter_for(sim),
        VERSIONS,
        RUBRIC,
        f"cache-{uuid.uuid4().hex[:6]}",
        RunOptions(seed=1),
    )
    billed = sim.meter.snapshot().billed
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT request_id, tokens_in, tokens_out, tokens_cached, cost_nanos,"
                " tokens_reasoning"
                " FROM ledger_events WHERE type = 'usage'"
            )
        ).all()
    assert len(rows) == 12 and {r.request_id for r in rows} == set(billed)
    for r in rows:
        call = billed[r.request_id]
        assert call.cached_tokens > 0  # the simulator did cache
        assert (r.tokens_in, r.tokens_out, r.tokens_cached) == (
            call.prompt_tokens,
            call.completion_tokens,
            call.cached_tokens,
        )
        bill = PRICES.cost(
            call.model, call.prompt_tokens, call.completion_tokens, cached=call.cached_tokens
        )
        # The product's table and the simulator's own meter agree to the nano-dollar.
        assert r.cost_nanos == bill == call.cost_nanos
        # Reasoning tokens, where reported, are booked as part of the output.
        reasoning = call.completion_tokens // 4 if shape == "full" else 0
        assert r.tokens_reasoning == reasoning
    full_price = sum(
        PRICES.cost(c.model, c.prompt_tokens, c.completion_tokens) for c in billed.values()
    )
    assert sum(r.cost_nanos for r in rows) < full_price


@pytest.mark.parametrize(
    ("details", "reasoning"),
    [
        ({"reasoning_tokens": 30}, 30),
        ({"reasoning_tokens": 500}, 50),  # never more than the output it is part of
        ({"reasoning_tokens": -1}, 0),
        (None, 0),
    ],
)
def test_reasoning_tokens_are_read_as_part_of_the_output(
    details: dict[str, int] | None, reasoning: int
) -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 50, "completion_tokens_details": details}
    got = billed_usage(usage)
    assert got is not None and (got.tokens_out, got.reasoning) == (50, reasoning)
