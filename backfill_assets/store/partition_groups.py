"""Many small partitions read in one query, each row routed back to its partition.

A small tenant's partition holds a handful of posts: one query per partition costs more in
building the statement than in reading it (10,000 one-partition tenants). A group's query
selects by tenant and stored slice, and ``Owners`` routes each row to the partition that holds
its (tenant, slice). Groups are bounded by posts, so memory stays bounded by one group, or by
one partition larger than the bound.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import sqlalchemy as sa

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


def claimed_by(table: sa.Table, owners: Owners) -> sa.ColumnElement[bool]:
    """Rows of ``table`` whose (tenant, slice) may belong to one of ``owners``: a superset
    (tenants x slices) that the caller narrows with ``Owners.get``."""
    tenants = sorted({t for t, _s in owners})
    slices = sorted({s for _t, s in owners})
    # One value is an equality (the indexes' prefix); a few are an IN list, still indexed.
    by_tenant = (
        table.c.tenant_id == tenants[0] if len(tenants) == 1 else table.c.tenant_id.in_(tenants)
    )
    by_slice = table.c.slice == slices[0] if len(slices) == 1 else table.c.slice.in_(slices)
    return sa.and_(by_tenant, by_slice)


def owners_of(tenant_id: str, slices: Sequence[int], key: str = "") -> dict[tuple[str, int], str]:
    """The owners of one partition."""
    return {(tenant_id, s): key for s in slices}
