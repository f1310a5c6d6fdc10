"""What the pending work of each tenant will cost: the cheap estimate and the reserved bound.

``dry-run`` and the ``backfill_plan`` asset show both: the estimate (UTF-8 bytes / 3, what a
typical tokenizer bills) for planning, and the upper bound the budget reserves (every byte a
token, plus template, schema and ``max_tokens``), which is what a strict cap has to hold.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy.engine import Connection

from backfill_assets.core.keys import SLICE_COUNT, Versions, work_key
from backfill_assets.core.prices import PriceTable
from backfill_assets.core.rubric import (
    MAX_OUTPUT_TOKENS,
    Rubric,
    call_token_bound,
    estimate_prompt_tokens,
)
from backfill_assets.dispatch.batch_options import BATCH_PRICE_FACTOR
from backfill_assets.store.work import pending_posts


@dataclass
class TenantEstimate:
    """One tenant's pending keys and what sending them may cost."""

    tenant: str
    keys: int = 0
    estimated_tokens: int = 0
    bound_tokens: int = 0
    estimated_cost_usd: float = 0.0
    bound_cost_usd: float = 0.0
    # The same estimate at the Batch API's price (BACKFILL_DISPATCH=batch).
    estimated_cost_usd_batch: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON form (costs rounded to 1e-6 USD)."""
        out = asdict(self)
        out["estimated_cost_usd"] = round(self.estimated_cost_usd, 6)
        out["bound_cost_usd"] = round(self.bound_cost_usd, 6)
        out["estimated_cost_usd_batch"] = round(self.estimated_cost_usd_batch, 6)
        return out


def estimate_pending(
    conn: Connection,
    tenants: Iterable[str],
    versions: Versions,
    rubric: Rubric,
    prices: PriceTable | None = None,
) -> list[TenantEstimate]:
    """Stream every tenant's pending posts (one stored slice at a time) and add them up."""
    out: list[TenantEstimate] = []
    for tenant in tenants:
        est = TenantEstimate(tenant)
        for s in range(SLICE_COUNT):
            for row in pending_posts(conn, tenant, [s], versions):
                est.keys += 1
                prompt = estimate_prompt_tokens(rubric, row.text)
                key = work_key(versions, tenant, row.post_id, row.content_hash)
                bound = call_token_bound(rubric, key, row.text)
                est.estimated_tokens += prompt + MAX_OUTPUT_TOKENS
                est.bound_tokens += bound
                if prices is not None:
                    est.estimated_cost_usd += prices.cost(versions.model, prompt, MAX_OUTPUT_TOKENS)
                    est.bound_cost_usd += prices.cost(
                        versions.model, bound - MAX_OUTPUT_TOKENS, MAX_OUTPUT_TOKENS
                    )
        est.estimated_cost_usd_batch = est.estimated_cost_usd * BATCH_PRICE_FACTOR
        out.append(est)
    return out
