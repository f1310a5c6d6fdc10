"""The inputs of a deadline plan, measured here: pending work and its prices, the limit this
run gets, and how fast this store's batches have completed and been cancelled
(``domain/money/deadline.py`` plans)."""

from __future__ import annotations

import datetime as dt
import math
import statistics
from collections.abc import Mapping, Sequence
from decimal import Decimal

from sqlalchemy.engine import Connection

from backfill_assets.config.settings import Settings
from backfill_assets.defs.model_resources import model_resource, versions_for
from backfill_assets.domain.money.deadline import DeadlinePlan, Work, make_plan
from backfill_assets.domain.money.nanos import usd
from backfill_assets.domain.money.prices import Tier
from backfill_assets.domain.money.tier_split import Rates
from backfill_assets.ledger.engine import read_tx
from backfill_assets.ledger.engines import store_engine
from backfill_assets.ledger.run.batch_cancels import cancel_durations, endpoint_id
from backfill_assets.ledger.run.submissions import batch_durations
from backfill_assets.ledger.run.tenants import tenant_regions
from backfill_assets.ledger.spend.budget import budget_status
from backfill_assets.ledger.spend.deadline_plans import flex_history
from backfill_assets.ledger.spend.estimate import TenantEstimate, estimate_pending
from backfill_assets.ledger.spend.limiter_members import live_members

# Batches of this store's history needed before it replaces the prior.
MIN_BATCH_HISTORY = 3
# Flex requests of this store's history needed before their refused share replaces the prior.
MIN_FLEX_HISTORY = 100
# Cancels of this store's history at an endpoint needed before they replace the setting.
MIN_CANCEL_HISTORY = 3
# Members heartbeat every second or so; one silent for this long has left the limit.
_MEMBER_TTL_S = 5.0


class NoLimitKnown(ValueError):
    """The synchronous throughput cannot be known: no configured limit."""


class NoTiersToMix(ValueError):
    """The dialect's endpoint has one tier: there is no mix of batch, flex and standard."""


def batch_completion_s(durations: Sequence[float], prior_s: float) -> float:
    """What a plan assumes a batch takes: the 90th percentile of this store's completed
    batches once there are a few, else the configured prior (pessimistic by default)."""
    if len(durations) < MIN_BATCH_HISTORY:
        return prior_s
    return statistics.quantiles(durations, n=10, method="inclusive")[-1]


def cancel_seconds(
    history: Mapping[str, Sequence[float]], endpoints: Sequence[str], setting_s: float
) -> float:
    """What a plan assumes a batch cancel takes: per Batch API endpoint the plan's tenants
    use, the longest of its newest cancels once there are a few (a cancel that overruns costs
    the deadline, so the bound, not the typical), else the setting; the longest of those."""
    return max(
        (
            max(seen) if len(seen := history.get(e, ())) >= MIN_CANCEL_HISTORY else setting_s
            for e in endpoints
        ),
        default=setting_s,
    )


def flex_unavailable(calls: int, refused: int, prior: float) -> float:
    """The share of flex requests a plan assumes refused for capacity: this store's history
    under earlier plans once it holds enough requests, else the configured prior."""
    if calls < MIN_FLEX_HISTORY:
        return prior
    return min(1.0, refused / calls)


def uses_flex(settings: Settings) -> bool:
    """The synchronous tier is flex, at a backend that has one (OpenAI-compatible)."""
    return settings.model.service_tier == "flex" and settings.model.model_backend == "openai"


def plan_rates(
    settings: Settings,
    sync_per_s: float,
    durations: Sequence[float],
    flex_seen: tuple[int, int],
    cancel_s: float,
) -> Rates:
    """The tiers' rates for a plan. Flex and standard share the provider's limit: each gets
    the whole synchronous rate while it is sent, flex less the share it refuses (with flex in
    use, ``BACKFILL_SERVICE_TIER=flex``). A cancel's end is seen at the next status poll, so
    the plan allows one poll more than the cancel itself."""
    has_batch = settings.model.model_backend == "openai"
    completion = (
        batch_completion_s(durations, settings.batch.batch_prior_seconds) if has_batch else math.inf
    )
    cancel = cancel_s + settings.batch.batch_poll_seconds if has_batch else 0.0
    if not uses_flex(settings):
        return Rates(sync_per_s, 0.0, 0.0, completion, cancel)
    refused = flex_unavailable(*flex_seen, settings.batch.flex_unavailable_prior)
    return Rates(sync_per_s, sync_per_s, refused, completion, cancel)


def batch_endpoints(settings: Settings, regions: Mapping[str, str | None]) -> list[str]:
    """The Batch API endpoints (as ``ledger/run/batch_cancels.py`` names them) the tenants of
    ``regions`` use: the default one, or their region's (a region with none is not sent)."""
    urls = {
        settings.model.model_base_url if r is None else settings.region_base_urls.get(r)
        for r in regions.values()
    }
    return sorted(endpoint_id(u) for u in urls if u)


def sync_keys_per_s(settings: Settings, tokens_per_key: float, members: int) -> float:
    """Keys per second the synchronous tier gets: the configured limits (requests and tokens)
    divided among the processes already sharing them, plus this run."""
    if settings.model.model_backend == "fake" and not (settings.http.rpm or settings.http.tpm):
        # The deterministic fake has no limit: its latency and the concurrency bound it.
        latency_s = max(settings.drills.fake_latency_ms, 1.0) / 1000.0
        return settings.run.concurrency / latency_s
    limits = []
    if settings.http.rpm:
        limits.append(settings.http.rpm / 60.0)
    if settings.http.tpm and tokens_per_key > 0:
        limits.append(settings.http.tpm / 60.0 / tokens_per_key)
    if not limits:
        raise NoLimitKnown(
            "a deadline plan needs the provider's limit: set BACKFILL_RPM (and BACKFILL_TPM) "
            "to the limits of your account"
        )
    share = 1.0 / (1 + members) if settings.http.share_limit else 1.0
    return min(limits) * share


def _work(est: TenantEstimate, left: tuple[int | None, Decimal | None]) -> Work:
    n = max(est.keys, 1)
    standard = est.estimated_cost_usd / n
    batch = est.estimated_cost_usd_batch / n
    flex = est.estimated_cost_usd_flex / n
    tokens_left, dollars_left = left
    return Work(
        tenant=est.tenant,
        keys=est.keys,
        cost_per_key={Tier.STANDARD: standard, Tier.FLEX: flex, Tier.BATCH: batch},
        budget_left=dollars_left,
        bound_tokens=est.bound_tokens,
        tokens_left=tokens_left,
    )


def _left(
    conn: Connection, tenant: str, default_tokens: int | None
) -> tuple[int | None, Decimal | None]:
    """What the tenant's token and dollar budgets have left (None: no cap in that unit)."""
    status = budget_status(conn, tenant, default_tokens)
    free = status.free
    return (
        None if status.caps.tokens is None else free.tokens,
        None if status.caps.nanos is None else usd(free.nanos),
    )


def plan_deadline(
    settings: Settings,
    tenants: Sequence[str],
    deadline: dt.datetime,
    margin: float,
    now: dt.datetime,
) -> DeadlinePlan:
    """The plan for ``tenants``' pending keys (read-only: nothing is sent or stored)."""
    if settings.model.model_dialect != "chat-json":
        raise NoTiersToMix(
            f"BACKFILL_MODEL_DIALECT={settings.model.model_dialect} is sent at one tier, "
            "synchronously: there is no mix of batch, flex and standard to plan; "
            "run without --deadline"
        )
    engine = store_engine(settings.store)
    model = model_resource(settings)
    versions = versions_for(model, settings.rubric())
    cap = settings.run.tenant_budget_tokens
    with read_tx(engine) as conn:
        estimates = estimate_pending(
            conn, tenants, versions, settings.rubric(), settings.model.prices()
        )
        durations = batch_durations(conn, versions.model)
        flex_seen = flex_history(conn, versions.model)
        endpoints = batch_endpoints(settings, tenant_regions(conn, [e.tenant for e in estimates]))
        cancels = cancel_durations(conn, endpoints, versions.model)
        left = {e.tenant: _left(conn, e.tenant, cap or None) for e in estimates}
    keys = sum(e.keys for e in estimates)
    tokens_per_key = sum(e.estimated_tokens for e in estimates) / keys if keys else 0.0
    members = live_members(engine, _MEMBER_TTL_S)
    rates = plan_rates(
        settings,
        sync_keys_per_s(settings, tokens_per_key, members),
        durations,
        flex_seen,
        cancel_seconds(cancels, endpoints, settings.batch.batch_cancel_seconds),
    )
    work = [_work(e, left[e.tenant]) for e in estimates if e.keys]
    return make_plan(work, rates, now, deadline, margin)
