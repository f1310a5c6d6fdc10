"""Per-tenant budgets in tokens and in dollars: a strict cap by reservation (arithmetic here,
storage injected).

A call reserves its worst case in both units (tokens, and nano-dollars at the dearest price it
can be booked at, no cache discount assumed), settles to what was billed, and gives the rest
back. A tenant may have a token cap, a dollar cap, both or neither; a unit without a cap never
refuses anything.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Spend:
    """Tokens and nano-dollars: what a call may bill, or what a budget has left."""

    tokens: int = 0
    nanos: int = 0

    def __add__(self, other: Spend) -> Spend:
        return Spend(self.tokens + other.tokens, self.nanos + other.nanos)

    def __sub__(self, other: Spend) -> Spend:
        return Spend(self.tokens - other.tokens, self.nanos - other.nanos)


@dataclass(frozen=True, slots=True)
class Caps:
    """A tenant's caps (None: no cap in that unit)."""

    tokens: int | None = None
    nanos: int | None = None

    @property
    def any(self) -> bool:
        """Whether anything is capped."""
        return self.tokens is not None or self.nanos is not None

    def short(self, want: Spend, have: Spend) -> Spend:
        """What ``have`` lacks of ``want`` in the capped units (0 where uncapped)."""
        return Spend(
            0 if self.tokens is None else max(0, want.tokens - have.tokens),
            0 if self.nanos is None else max(0, want.nanos - have.nanos),
        )

    def exceeds(self, need: Spend, free: Spend) -> bool:
        """Whether ``need`` passes ``free`` in a capped unit."""
        return (self.tokens is not None and need.tokens > free.tokens) or (
            self.nanos is not None and need.nanos > free.nanos
        )


class GrantLike(Protocol):
    """Result of growing a reservation."""

    @property
    def granted(self) -> Spend | None: ...

    @property
    def free_after(self) -> Spend: ...

    @property
    def caps(self) -> Caps: ...


class BudgetLedger(Protocol):
    """Durable, cross-process side of the budget."""

    def caps(self, tenant_id: str, default_tokens: int | None) -> Caps: ...

    def grant(
        self,
        tenant_id: str,
        reservation_id: str,
        want: Spend,
        minimum: Spend,
        default_tokens: int | None,
    ) -> GrantLike: ...

    def release(self, reservation_ids: list[str]) -> None: ...


def grant_size(want: int, minimum: int, free: int) -> int | None:
    """Units to grant a holder asking for ``want`` (at least ``minimum``) when ``free`` are left.

    At most half of what is free, never less than the request: a run that takes a budget in
    chunks for many calls cannot hoard a tenant's whole budget while another run waits.
    None when not even ``minimum`` is free.
    """
    if minimum > free or (minimum > 0 and free <= 0):
        return None
    return max(minimum, min(want, free // 2))


def grant_spend(want: Spend, minimum: Spend, free: Spend, caps: Caps) -> Spend | None:
    """``grant_size`` in each capped unit (an uncapped one gets what it asks); None when a
    capped unit cannot give ``minimum``."""
    tokens: int | None = want.tokens
    nanos: int | None = want.nanos
    if caps.tokens is not None:
        tokens = grant_size(want.tokens, minimum.tokens, free.tokens)
    if caps.nanos is not None:
        nanos = grant_size(want.nanos, minimum.nanos, free.nanos)
    if tokens is None or nanos is None:
        return None
    return Spend(tokens, nanos)


@dataclass(frozen=True, slots=True)
class Reservation:
    """What one attempt set aside; settled with the provider's usage."""

    tenant_id: str
    reservation_id: str | None
    bound: Spend
    # False: no dollar bound was worked out (an unpriced model, or no budget binds in the
    # run), so bound.nanos is 0 and means nothing.
    priced: bool = True
    # Of ``bound``: what a cascade's stages still ahead of this call may cost (reserved with
    # it, so a post is not screened when its tenant cannot pay for the rest; released with it).
    ahead: Spend = Spend()

    @property
    def tokens(self) -> int:
        """The tokens reserved."""
        return self.bound.tokens

    @property
    def call_bound(self) -> Spend:
        """What the call itself may bill: the bound without the stages ahead."""
        return self.bound - self.ahead


def over_bound(billed: Spend, reservation: Reservation) -> str:
    """Why a call billed past what was reserved for it ('' if it did not): the caps can no
    longer be promised for its tenant. Dollars count only where the call was priced."""
    bound = reservation.call_bound
    if billed.tokens > bound.tokens:
        return f"over_bound: billed {billed.tokens} > reserved bound {bound.tokens}"
    if reservation.priced and billed.nanos > bound.nanos:
        return f"over_bound: billed {billed.nanos} nano-dollars > reserved bound {bound.nanos}"
    return ""


@dataclass
class _TenantPool:
    reservation_id: str
    caps: Caps | None = None
    available: Spend = Spend()
    exhausted_below: Spend | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


# Why a tenant's calls were deferred, for the run log.
UNPRICED_UNDER_DOLLAR_CAP = "a dollar budget, and the model has no price"
CAP_REACHED = "its budget is spent or reserved"


class TenantBudgets:
    """Reserve before a call, settle after; never lets billed + reserved pass a cap.

    Budget is taken from the store in chunks so a call rarely waits on the database (at most
    half of what is free at a time, see ``grant_size``); the writer moves settled amounts from
    the reservation to the tenant's billed totals in the same transaction as the usage event,
    so ``billed + reserved`` covers every call in flight. The store keeps a reservation for as
    long as its holder lives (``store.budget``), however long it is silent.

    A tenant's caps are read once per run on its first call (a tenant with none never
    touches the store again); each grant re-reads them in its transaction.
    """

    def __init__(
        self, default_tokens: int | None, ledger: BudgetLedger | None, chunk_calls: int = 16
    ) -> None:
        self.default_tokens = default_tokens if default_tokens and default_tokens > 0 else None
        self._ledger = ledger
        self._chunk_calls = max(1, chunk_calls)
        self._pools: dict[str, _TenantPool] = {}
        # tenant -> why its calls were deferred (the first reason seen).
        self.deferred: dict[str, str] = {}

    @property
    def enabled(self) -> bool:
        """False when no budget can apply (then nothing touches the store)."""
        return self._ledger is not None

    async def reserve(
        self, tenant_id: str, bound: Spend, priced: bool = True
    ) -> Reservation | None:
        """Set ``bound`` aside; ``None`` means defer (a cap would be passed)."""
        if self._ledger is None:
            return Reservation(tenant_id, None, bound, priced)
        ledger = self._ledger
        pool = self._pools.get(tenant_id)
        if pool is None:
            pool = self._pools[tenant_id] = _TenantPool(reservation_id=uuid.uuid4().hex)
        async with pool.lock:
            if pool.caps is None:
                pool.caps = await asyncio.to_thread(ledger.caps, tenant_id, self.default_tokens)
            if not pool.caps.any:
                return Reservation(tenant_id, None, bound, priced)
            if pool.caps.nanos is not None and not priced:
                self.deferred.setdefault(tenant_id, UNPRICED_UNDER_DOLLAR_CAP)
                return None
            need = pool.caps.short(bound, pool.available)
            if need != Spend():
                below = pool.exhausted_below
                if below is not None and pool.caps.exceeds(need, below):
                    self.deferred.setdefault(tenant_id, CAP_REACHED)
                    return None
                want = Spend(
                    max(need.tokens, bound.tokens * self._chunk_calls),
                    max(need.nanos, bound.nanos * self._chunk_calls),
                )
                grant = await asyncio.to_thread(
                    ledger.grant, tenant_id, pool.reservation_id, want, need, self.default_tokens
                )
                pool.caps = grant.caps
                if grant.granted is None:
                    pool.exhausted_below = grant.free_after
                    self.deferred.setdefault(tenant_id, CAP_REACHED)
                    return None
                pool.available += grant.granted
            pool.available -= bound
            return Reservation(tenant_id, pool.reservation_id, bound, priced)

    def settle(self, reservation: Reservation, billed: Spend) -> None:
        """Return the unused part of a reservation to the tenant's pool."""
        if reservation.reservation_id is None:
            return
        pool = self._pools[reservation.tenant_id]
        pool.available += reservation.bound - billed

    def reservation_ids(self) -> list[str]:
        """Live reservation ids (for the release)."""
        return [p.reservation_id for p in self._pools.values()]

    async def release(self) -> None:
        """Give back everything unused; call after the final flush."""
        if self._ledger is not None:
            await asyncio.to_thread(self._ledger.release, self.reservation_ids())
        self._pools.clear()
