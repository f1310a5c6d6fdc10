"""Groups of partitions read in one query: in order, bounded by posts and by count, and the
query selects exactly the (tenant, slice) pairs the group holds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from backfill_assets.ledger.run.partition_groups import claims, grouped


@given(
    st.lists(st.integers(min_value=0, max_value=9_000), max_size=60),
    st.integers(min_value=1, max_value=10_000),
    st.integers(min_value=1, max_value=7),
)
def test_groups_keep_the_order_and_the_bounds(sizes: list[int], max_posts: int, most: int) -> None:
    parts = list(enumerate(sizes))
    groups = grouped(parts, lambda p: p[1], max_posts=max_posts, max_parts=most)
    assert [p for g in groups for p in g] == parts
    for g in groups:
        assert 1 <= len(g) <= most
        # Over the bound only as a partition larger than the bound, alone.
        assert sum(n for _i, n in g) <= max_posts or len(g) == 1


def test_small_partitions_share_a_group_and_a_big_one_stands_alone() -> None:
    sizes = [5, 5, 5, 6_000, 5]
    groups = grouped(sizes, lambda n: n, max_posts=5_000)
    assert groups == [[5, 5, 5], [6_000], [5]]


@given(
    st.dictionaries(
        st.tuples(st.sampled_from("abcdef"), st.integers(min_value=0, max_value=15)),
        st.sampled_from(["p0", "p1", "p2"]),
        min_size=1,
    )
)
def test_claims_cover_exactly_the_owned_pairs(owners: dict[tuple[str, int], str]) -> None:
    pairs = [(t, s) for tenants, slices in claims(owners) for t in tenants for s in slices]
    assert sorted(pairs) == sorted(owners)  # each pair once, none that no partition holds


def test_small_tenants_are_one_claim() -> None:
    owners = {(t, s): f"s00|{t}" for t in ("a", "b", "c") for s in range(16)}
    assert claims(owners) == [(["a", "b", "c"], list(range(16)))]


def test_no_owners_claim_no_row() -> None:
    import sqlalchemy as sa

    from backfill_assets.ledger.run.partition_groups import claimed_by
    from backfill_assets.ledger.tables import posts

    assert claims({}) == []
    assert str(claimed_by(posts, {})) == str(sa.false())
