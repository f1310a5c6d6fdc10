"""Region lanes: which endpoint each tenant's requests go to, and nowhere else.

A process knows the default endpoint (the run's ``make_adapter`` and batch endpoint) plus the
regional ones it was configured with (``Lanes``). A tenant without a region uses the default
lane; a tenant with a region uses that region's lane or, if this process has none, is not
dispatched at all (fail closed). There is no fallback from one region to another.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from backfill_assets.dispatch.partition_run import DEFAULT_LANE, Lanes, PartitionRef
from backfill_assets.providers.models.base import ModelAdapter, ModelRequest, ModelResponse, NotSent


@dataclass
class Routing:
    """A run's partitions by lane, and those with no lane in this process (by region)."""

    lanes: dict[str | None, list[PartitionRef]] = field(default_factory=dict)
    unroutable: dict[str, list[str]] = field(default_factory=dict)
    region_of: dict[str, str | None] = field(default_factory=dict)

    @property
    def routed(self) -> list[PartitionRef]:
        """Every partition that has a lane, in the run's order per lane."""
        return [ref for refs in self.lanes.values() for ref in refs]


def route_partitions(
    refs: Sequence[PartitionRef],
    region_of: Mapping[str, str | None],
    lanes: Lanes,
    batch: bool = False,
) -> Routing:
    """Group partitions by lane; a tenant the store does not know goes to the default lane
    (it has no region, and the work query finds no posts for it)."""
    routing = Routing()
    for ref in refs:
        region = region_of.get(ref.tenant_id)
        ok, lane = lanes.lane(region, batch)
        if ok:
            routing.lanes.setdefault(lane, []).append(ref)
            routing.region_of[ref.tenant_id] = lane
        else:
            assert region is not None
            routing.unroutable.setdefault(region, []).append(ref.key)
    return routing


class RegionRouter(ModelAdapter):
    """One adapter per lane; each request goes to its tenant's lane, never to another."""

    name = "region-router"

    def __init__(
        self, adapters: Mapping[str | None, ModelAdapter], lane_of: Mapping[str, str | None]
    ) -> None:
        super().__init__()
        self._adapters = dict(adapters)
        self._lane_of = dict(lane_of)

    def parts(self) -> list[ModelAdapter]:
        """The lanes' adapters."""
        return list(self._adapters.values())

    def halt(self, reason: str) -> None:
        """A run-level error stops every lane (the run is stopping)."""
        super().halt(reason)
        for adapter in self._adapters.values():
            adapter.halt(reason)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send through the tenant's lane; a tenant without one is never sent anywhere."""
        self.check_not_halted()
        if request.tenant_id not in self._lane_of:
            raise NotSent(f"not sent: tenant {request.tenant_id} has no lane in this run")
        adapter = self._adapters[self._lane_of[request.tenant_id]]
        return await adapter.complete(request)

    def cost_of(self, model: str, tokens_in: int, tokens_out: int) -> int:
        """Lanes share the model and its price table; the first lane prices."""
        return self.parts()[0].cost_of(model, tokens_in, tokens_out)

    async def aclose(self) -> None:
        """Close every lane's connections."""
        results = await asyncio.gather(
            *(a.aclose() for a in self._adapters.values()), return_exceptions=True
        )
        for r in results:
            if isinstance(r, BaseException):
                raise r


def lane_adapters(
    routing: Routing, make_adapter: Callable[[], ModelAdapter], lanes: Lanes
) -> Callable[[], ModelAdapter]:
    """The run's ``make_adapter``: the plain default adapter when only it is used, else a
    router over a fresh adapter per lane used (built on the caller's event loop)."""
    used = list(routing.lanes)
    if used in ([], [DEFAULT_LANE]):
        return make_adapter

    def build() -> ModelAdapter:
        adapters: dict[str | None, ModelAdapter] = {
            lane: make_adapter() if lane is None else lanes.adapters[lane]() for lane in used
        }
        return RegionRouter(adapters, routing.region_of)

    return build
