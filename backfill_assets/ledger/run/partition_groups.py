"""Many small partitions read in one query, each row routed back to its partition.

A small tenant's partition holds a handful of posts: one query per partition costs more in
building the statement than in reading it (10,000 one-partition tenants). A group's query
selects exactly the partitions' (tenant, stored slice) pairs, and ``Owners`` routes each row
to the partition that holds it. Groups are bounded by posts, so memory stays bounded by one
group, or by one partition larger than the bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa

from backfill_assets.ledger.run.partition_counts import held_posts

# (tenant, stored slice) -> the key of the partition that holds it.
Owners = Mapping[tuple[str, int], str]

MAX_GROUP_POSTS = 5_000
# Bind parameters stay far below SQLite's 32,766 and PostgreSQL's 65,535.
MAX_GROUP_PARTITIONS = 500

T = TypeVar("T")


def grouped(
    parts: Sequence[T],
    posts_of: Callable[[T], int],
    max_posts: int = MAX_GROUP_POSTS,
    max_parts: int = MAX_GROUP_PARTITIONS,
) -> list[list[T]]:
    """``parts`` in order, cut into runs of at most ``max_parts`` holding at most
    ``max_posts`` posts together (a larger partition is a group of its own)."""
    out: list[list[T]] = []
    group: list[T] = []
    held = 0
    for part in parts:
        n = posts_of(part)
        if group and (held + n > max_posts or len(group) >= max_parts):
            out.append(group)
            group, held = [], 0
        group.append(part)
        held += n
    if group:
        out.append(group)
    return out


def claims(owners: Mapping[tuple[str, int], object]) -> list[tuple[list[str], list[int]]]:
    """``owners`` as few (tenants, slices) pairs whose products are exactly its (tenant,
    slice) pairs: the tenants of each set of slices (small tenants all hold every slice in one
    partition, so a group of them is one pair)."""
    # Called for each table a group reads, over 16 (tenant, slice) pairs a small tenant: no
    # container is made for a key that has one already.
    by_owner: dict[tuple[str, object], list[int]] = {}
    for (tenant, slice_no), owner in owners.items():
        chosen = by_owner.get((tenant, owner))
        if chosen is None:
            by_owner[(tenant, owner)] = [slice_no]
        else:
            chosen.append(slice_no)
    by_slices: dict[tuple[int, ...], set[str]] = {}
    for (tenant, _owner), slices in by_owner.items():
        by_slices.setdefault(tuple(sorted(set(slices))), set()).add(tenant)
    return [(sorted(tenants), list(slices)) for slices, tenants in sorted(by_slices.items())]


def claimed_by(table: sa.Table, owners: Mapping[tuple[str, int], object]) -> sa.ColumnElement[bool]:
    """Rows of ``table`` whose (tenant, slice) is one of ``owners``' (none if it is empty)."""
    if not owners:
        return sa.false()
    terms = [
        sa.and_(_one_of(table.c.tenant_id, tenants), _one_of(table.c.slice, slices))
        for tenants, slices in claims(owners)
    ]
    return terms[0] if len(terms) == 1 else sa.or_(*terms)


class Held(Protocol):
    """A partition as the groups see it: its key, tenant and stored slices."""

    @property
    def key(self) -> str: ...
    @property
    def tenant_id(self) -> str: ...
    @property
    def slices(self) -> Sequence[int]: ...


H = TypeVar("H", bound=Held)


def grouped_by_posts(parts: Sequence[H], sizes: Mapping[tuple[str, int], int]) -> list[list[H]]:
    """``grouped`` by the posts each partition holds (``sizes`` from ``post_counts``)."""
    return grouped(parts, lambda part: held_posts(sizes, part.tenant_id, part.slices))


def owners_of(tenant_id: str, slices: Sequence[int], key: str = "") -> dict[tuple[str, int], str]:
    """The owners of one partition."""
    return {(tenant_id, s): key for s in slices}


def owners_of_all(parts: Iterable[Held]) -> dict[tuple[str, int], str]:
    """The owners of every partition of ``parts``."""
    return {(p.tenant_id, s): p.key for p in parts for s in p.slices}


def _one_of(column: sa.Column[Any], values: Sequence[Any]) -> sa.ColumnElement[bool]:
    # One value is an equality (the indexes' prefix); a few are an IN list, still indexed.
    return column == values[0] if len(values) == 1 else column.in_(list(values))
