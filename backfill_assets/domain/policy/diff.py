"""Comparing policies: the order of human versions, and what changed from one to the next."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from backfill_assets.domain.policy.document import Policy


def version_order(version: str) -> tuple[tuple[int, int, str], ...]:
    """A sort key of human versions: numbers by value (``9`` < ``10``), words by text."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part)
        for part in re.findall(r"\d+|[^\d]+", version)
    )


@dataclass(frozen=True, slots=True)
class Change:
    """One difference between two policies: ``added``, ``removed`` or ``changed``."""

    kind: Literal["label", "rule", "policy"]
    item: str
    change: Literal["added", "removed", "changed"]
    fields: tuple[str, ...] = ()


def diff_policies(a: Policy, b: Policy) -> list[Change]:
    """Labels and rules added, removed or changed from ``a`` to ``b`` (and the policy's fields)."""
    out: list[Change] = []
    top = [f for f in ("id", "version", "instructions") if getattr(a.doc, f) != getattr(b.doc, f)]
    for what, old_items, new_items in (
        ("label order", a.doc.labels, b.doc.labels),
        ("rule order", a.doc.rules, b.doc.rules),
    ):
        # The order the model reads them in, of the items both have (adding one is no move).
        both = {x.id for x in old_items} & {x.id for x in new_items}
        if [x.id for x in old_items if x.id in both] != [x.id for x in new_items if x.id in both]:
            top.append(what)
    if top:
        out.append(Change("policy", a.doc.id, "changed", tuple(top)))
    for kind, old, new in (
        ("label", a.doc.labels, b.doc.labels),
        ("rule", a.doc.rules, b.doc.rules),
    ):
        olds = {x.id: x.model_dump(mode="json") for x in old}
        news = {x.id: x.model_dump(mode="json") for x in new}
        for item in news:
            if item not in olds:
                out.append(Change(kind, item, "added"))  # type: ignore[arg-type]
        for item, before in olds.items():
            after = news.get(item)
            if after is None:
                out.append(Change(kind, item, "removed"))  # type: ignore[arg-type]
            elif after != before:
                changed = tuple(f for f in after if after[f] != before.get(f))
                out.append(Change(kind, item, "changed", changed))  # type: ignore[arg-type]
    return out
