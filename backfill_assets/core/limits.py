"""Per-tenant token budgets: a strict cap by reservation (arithmetic here, storage injected)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Protocol


class GrantLike(Protocol):
    """Result of growing a reservation."""

    @property
    def granted(self) -> int: ...

    @property
    def free_after(self) -> int: ...


class BudgetLedger(Protocol):
    """Durable, cross-process side of the budget."""

    def grant(
        self, tenant_id: str, reservation_id: str, want: int, minimum: int, cap: int
    ) -> GrantLike: ...

    def release(self, reservation_ids: list[str]) -> None: ...


def grant_size(want: int, minimum: int, free: int) -> int:
    """Tokens to grant a holder asking for ``want`` (at least ``minimum``) when ``free`` are left.

    At most half of what is free, never less than the request: a run that takes tokens in
    chunks for many calls cannot hoard a tenant's whole budget while another run waits.
    0 when not even ``minimum`` is free.
    """
    if minimum > free or free <= 0:
        return 0
    return max(minimum, min(want, free // 2))


@dataclass(frozen=True, slots=True)
class Reservation:
    """Tokens set aside for one attempt; settled with the provider's usage."""

    tenant_id: str
    reservation_id: str | None
    tokens: int


@dataclass
class _TenantPool:
    reservation_id: str
    available: int = 0
    exhausted_below: int | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class TenantBudgets:
    """Reserve before a call, settle after; never lets billed + reserved exceed the cap.

    Tokens are taken from the store in chunks so a call rarely waits on the database (at most
    half of what is free at a time, see ``grant_size``); the writer moves settled tokens from
    the reservation to the tenant's billed total in the same transaction as the usage event,
    so ``billed + reserved`` covers every call in flight. The store keeps a reservation for as
    long as its holder lives (``store.budget``), however long it is silent.
    """

    def __init__(self, cap: int | None, ledger: BudgetLedger | None, chunk_calls: int = 16) -> None:
        self.cap = cap if cap and cap > 0 else None
        self._ledger = ledger
        self._chunk_calls = max(1, chunk_calls)
        self._pools: dict[str, _TenantPool] = {}

    @property
    def enabled(self) -> bool:
        """False when no cap is configured (then nothing touches the store)."""
        return self.cap is not None and self._ledger is not None

    async def reserve(self, tenant_id: str, tokens: int) -> Reservation | None:
        """Set ``tokens`` aside; ``None`` means defer (the cap would be passed)."""
        if not self.enabled:
            return Reservation(tenant_id, None, tokens)
        pool = self._pools.get(tenant_id)
        if pool is None:
            pool = self._pools[tenant_id] = _TenantPool(reservation_id=uuid.uuid4().hex)
        async with pool.lock:
            if pool.available < tokens:
                if (
                    pool.exhausted_below is not None
                    and tokens - pool.available > pool.exhausted_below
                ):
                    return None
                need = tokens - pool.available
                assert self._ledger is not None and self.cap is not None
                grant = await asyncio.to_thread(
                    self._ledger.grant,
                    tenant_id,
                    pool.reservation_id,
                    max(need, tokens * self._chunk_calls),
                    need,
                    self.cap,
                )
                if grant.granted == 0:
                    pool.exhausted_below = grant.free_after
                    return None
                pool.available += grant.granted
            pool.available -= tokens
            return Reservation(tenant_id, pool.reservation_id, tokens)

    def settle(self, reservation: Reservation, actual_tokens: int) -> None:
        """Return the unused part of a reservation to the tenant's pool."""
        if reservation.reservation_id is None:
            return
        pool = self._pools[reservation.tenant_id]
        pool.available += reservation.tokens - actual_tokens

    def reservation_ids(self) -> list[str]:
        """Live reservation ids (for the release)."""
        return [p.reservation_id for p in self._pools.values()]

    async def release(self) -> None:
        """Give back everything unused; call after the final flush."""
        if self.enabled and self._ledger is not None:
            await asyncio.to_thread(self._ledger.release, self.reservation_ids())
        self._pools.clear()
