"""What the pending work of each tenant will cost: the cheap estimate and the reserved bound.

``dry-run`` and the ``backfill_plan`` asset show both: the estimate (UTF-8 bytes / 3, what a
typical tokenizer bills) for planning, and the upper bound the budget reserves (every byte a
token, plus template, schema and ``max_tokens``), which is what a strict cap has to hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from sqlalchemy.engine import Connection

from backfill_assets.domain.money.nanos import usd, usd_text
from backfill_assets.domain.money.prices import PriceTable, Tier
from backfill_assets.domain.policy.rubric import (
    Rubric,
    call_token_bound,
    estimate_prompt_tokens,
)
from backfill_assets.domain.work.keys import SLICE_COUNT, Versions, work_key
from backfill_assets.ledger.run.work import pending_posts


@dataclass
class TenantEstimate:
    """One tenant's pending keys and what sending them may cost."""

    tenant: str
    keys: int = 0
    estimated_tokens: int = 0
    bound_tokens: int = 0
    # Nano-dollars (domain/money/nanos.py).
    estimated_cost_nanos: int = 0
    bound_cost_nanos: int = 0
    # What a batch chunk reserves for the same keys (the bound at the Batch API's price).
    bound_cost_nanos_batch: int = 0
    # The same estimate at the Batch API's price (BACKFILL_DISPATCH=batch).
    estimated_cost_nanos_batch: int = 0
    # ... and at the flex tier's (BACKFILL_SERVICE_TIER=flex).
    estimated_cost_nanos_flex: int = 0
    # A cascade's stages, each as if every pending post reached it (by stage name).
    stages: dict[str, TenantEstimate] = field(default_factory=dict)

    @property
    def estimated_cost_usd(self) -> Decimal:
        return usd(self.estimated_cost_nanos)

    @property
    def bound_cost_usd(self) -> Decimal:
        return usd(self.bound_cost_nanos)

    @property
    def estimated_cost_usd_batch(self) -> Decimal:
        return usd(self.estimated_cost_nanos_batch)

    @property
    def estimated_cost_usd_flex(self) -> Decimal:
        return usd(self.estimated_cost_nanos_flex)

    def as_dict(self) -> dict[str, Any]:
        """JSON form: dollars as exact decimal strings."""
        return {
            "tenant": self.tenant,
            "keys": self.keys,
            "estimated_tokens": self.estimated_tokens,
            "bound_tokens": self.bound_tokens,
            "estimated_cost_usd": usd_text(self.estimated_cost_nanos),
            "bound_cost_usd": usd_text(self.bound_cost_nanos),
            "bound_cost_usd_batch": usd_text(self.bound_cost_nanos_batch),
            "estimated_cost_usd_batch": usd_text(self.estimated_cost_nanos_batch),
            "estimated_cost_usd_flex": usd_text(self.estimated_cost_nanos_flex),
        }


def estimate_pending(
    conn: Connection,
    tenants: Iterable[str],
    versions: Versions,
    rubric: Rubric,
    prices: PriceTable | None = None,
    stages: Sequence[tuple[str, Rubric, str]] | None = None,
) -> list[TenantEstimate]:
    """Stream every tenant's pending posts (one stored slice at a time) and add them up.

    ``stages``: a cascade's stages (rubric, model): a pending post is counted through every
    one of them, the worst case, since which posts a stage passes on is known only once it
    has answered. Each stage's own estimate is in ``TenantEstimate.stages``."""
    out: list[TenantEstimate] = []
    for tenant in tenants:
        est = TenantEstimate(tenant)
        per = {name: TenantEstimate(tenant) for name, _r, _m in stages or ()}
        for s in range(SLICE_COUNT):
            for row in pending_posts(conn, tenant, [s], versions):
                est.keys += 1
                key = work_key(versions, tenant, row.post_id, row.content_hash)
                if stages is None:
                    _add_call(est, rubric, versions.model, key, row.text, prices)
                    continue
                for name, stage_rubric, model in stages:
                    per[name].keys += 1
                    _add_call(per[name], stage_rubric, model, key, row.text, prices)
        for part in per.values():
            est.estimated_tokens += part.estimated_tokens
            est.bound_tokens += part.bound_tokens
            est.estimated_cost_nanos += part.estimated_cost_nanos
            est.estimated_cost_nanos_batch += part.estimated_cost_nanos_batch
            est.estimated_cost_nanos_flex += part.estimated_cost_nanos_flex
            est.bound_cost_nanos += part.bound_cost_nanos
            est.bound_cost_nanos_batch += part.bound_cost_nanos_batch
        est.stages = per
        out.append(est)
    return out


def _add_call(
    est: TenantEstimate,
    rubric: Rubric,
    model: str,
    key: str,
    text: str,
    prices: PriceTable | None,
) -> None:
    """One call's estimate and bound, added to the tenant's."""
    cap = rubric.max_output_tokens
    prompt = estimate_prompt_tokens(rubric, text)
    bound = call_token_bound(rubric, key, text)
    est.estimated_tokens += prompt + cap
    est.bound_tokens += bound
    if prices is None:
        return
    est.estimated_cost_nanos += prices.cost(model, prompt, cap)
    est.estimated_cost_nanos_batch += prices.cost(model, prompt, cap, tier=Tier.BATCH)
    est.estimated_cost_nanos_flex += prices.cost(model, prompt, cap, tier=Tier.FLEX)
    # What a dollar budget reserves: sync (standard, and flex, which may be booked standard)
    # and batch.
    prompt_bound = bound - cap
    est.bound_cost_nanos += prices.cost_bound(model, [Tier.STANDARD], prompt_bound, cap) or 0
    est.bound_cost_nanos_batch += prices.cost_bound(model, [Tier.BATCH], prompt_bound, cap) or 0
