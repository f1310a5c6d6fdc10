"""A deadline plan's flex keys per tenant, handed out as the run sends: the plan's split, not
the clock, decides which keys go at flex, so the run pays the tiers the plan priced
(``domain/money/deadline.py``'s ``sync_split``; ``runner/deadline_run.py`` carries it out)."""

from __future__ import annotations

from collections.abc import Mapping


class FlexQuota:
    """How many more keys of each tenant go at flex; a key given flex keeps it on a retry (a
    refusal for capacity is normal for flex), and every other key goes at standard."""

    def __init__(self, keys: Mapping[str, int]) -> None:
        self._left = {tenant: n for tenant, n in keys.items() if n > 0}
        self._given: set[str] = set()

    def takes_flex(self, tenant: str, key: str) -> bool:
        """Whether ``key`` of ``tenant`` goes at flex (counted once per key)."""
        if key in self._given:
            return True
        left = self._left.get(tenant, 0)
        if left <= 0:
            return False
        self._left[tenant] = left - 1
        self._given.add(key)
        return True
