import random
import unicodedata

import pytest

from backfill_assets.domain.work.keys import (
    SLICE_COUNT,
    InvalidTenantId,
    Versions,
    content_hash,
    slice_of,
    validate_tenant_id,
    work_key,
)

V = Versions("task-1", "prompt@abc", "model-x")


def test_same_record_same_key() -> None:
    h = content_hash("hello")
    assert work_key(V, "acme", "p1", h) == work_key(V, "acme", "p1", h)
    assert len(work_key(V, "acme", "p1", h)) == 64


def test_separator_ambiguity_gives_different_keys() -> None:
    h = content_hash("x")
    assert work_key(V, "a", "bc", h) != work_key(V, "ab", "c", h)
    assert work_key(Versions("a", "bc", "m"), "t", "p", h) != work_key(
        Versions("ab", "c", "m"), "t", "p", h
    )


def test_nfc_and_nfd_texts_share_a_key() -> None:
    nfc = "Café crème"
    nfd = unicodedata.normalize("NFD", nfc)
    assert nfc != nfd
    assert content_hash(nfc) == content_hash(nfd)
    assert work_key(V, "acme", "p1", content_hash(nfc)) == work_key(
        V, "acme", "p1", content_hash(nfd)
    )


@pytest.mark.parametrize(
    "change",
    [
        lambda: work_key(
            Versions("task-2", "prompt@abc", "model-x"), "acme", "p1", content_hash("t")
        ),
        lambda: work_key(
            Versions("task-1", "prompt@def", "model-x"), "acme", "p1", content_hash("t")
        ),
        lambda: work_key(
            Versions("task-1", "prompt@abc", "model-y"), "acme", "p1", content_hash("t")
        ),
        lambda: work_key(V, "globex", "p1", content_hash("t")),
        lambda: work_key(V, "acme", "p2", content_hash("t")),
        lambda: work_key(V, "acme", "p1", content_hash("t edited")),
    ],
)
def test_any_input_change_changes_the_key(change) -> None:  # type: ignore[no-untyped-def]
    assert change() != work_key(V, "acme", "p1", content_hash("t"))


def test_slices_are_stable_under_reorder_and_append() -> None:
    ids = [("acme", f"p{i}") for i in range(500)] + [("globex", f"p{i}") for i in range(500)]
    before = {ident: slice_of(*ident) for ident in ids}
    shuffled = ids[:]
    random.Random(3).shuffle(shuffled)
    appended = shuffled + [("acme", f"new{i}") for i in range(100)]
    after = {ident: slice_of(*ident) for ident in appended}
    assert all(after[i] == before[i] for i in ids)
    # Buckets are used: every slice gets some of 1,000 posts.
    assert set(before.values()) == set(range(SLICE_COUNT))


@pytest.mark.parametrize(
    "bad", ["../evil", "Acme", "", "-lead", "a" * 41, "a b", "acme\n", 7, None]
)
def test_invalid_tenant_ids_are_refused(bad: object) -> None:
    with pytest.raises(InvalidTenantId):
        validate_tenant_id(bad)


def test_valid_tenant_ids() -> None:
    for ok in ("acme", "a", "0-tenant", "a" * 40, "acme-eu-1"):
        assert validate_tenant_id(ok) == ok
