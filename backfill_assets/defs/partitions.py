"""The moderation assets' partitions: one per tenant slice that holds posts.

A tenant spreads its posts over ``2**level`` partitions (``keys.level_for``): a small tenant
has one, ``s00|acme``; a big one up to 16, ``s00|acme`` .. ``s15|acme``. The partitions are
one dynamic dimension whose keys name the slice and the tenant (in the order Dagster gave the
keys of the tenant x slice grid this replaces, so materialisations made under it still count),
registered when an import makes or grows a tenant. 10,000 small tenants are 10,000
partitions, not 160,000.

Partition keys come from outside the code: the UI's "add partition" box, a sensor, the GraphQL
API, run tags. Every key is parsed here, with the same tenant rule as the import, before any
tenant id reaches a path, a lock or a query.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence

import dagster as dg
import sqlalchemy as sa

from backfill_assets.dispatch.partition_run import PartitionRef
from backfill_assets.domain.work.keys import (
    SLICE_KEYS,
    InvalidTenantId,
    slice_no,
    validate_tenant_id,
)

PARTITIONS_NAME = "tenant_slices"
moderation_partitions = dg.DynamicPartitionsDefinition(name=PARTITIONS_NAME)


class InvalidPartitionKey(ValueError):
    """A partition key that is not ``s<NN>|<valid tenant id>``."""


def partition_ref(partition_key: str) -> PartitionRef:
    """Parse and validate a partition key string (``"s03|acme"``)."""
    shown = repr(str(partition_key)[:64])
    slice_part, sep, tenant = str(partition_key).partition("|")
    try:
        if not sep:
            raise ValueError("expected <slice>|<tenant>, e.g. s00|acme")
        tenant_id = validate_tenant_id(tenant)
        number = slice_no(slice_part)
    except InvalidTenantId as exc:
        raise InvalidPartitionKey(
            f"partition {shown}: {exc} (tenant ids match ^[a-z0-9][a-z0-9-]{{0,39}}$)"
        ) from None
    except ValueError as exc:
        raise InvalidPartitionKey(f"partition {shown}: {exc}") from None
    return PartitionRef(key=str(partition_key), tenant_id=tenant_id, slice=number)


def run_refs(partition_keys: Iterable[str]) -> list[PartitionRef]:
    """Every partition of a run, validated; a ``dg.Failure`` naming the bad ones otherwise.

    Called first thing in each step, so a bad key fails the run before anything reads the
    prompt, opens the store or creates a lock file.
    """
    refs: list[PartitionRef] = []
    bad: list[str] = []
    for key in partition_keys:
        try:
            refs.append(partition_ref(key))
        except InvalidPartitionKey as exc:
            bad.append(str(exc))
    if bad:
        raise dg.Failure(
            description=(
                f"{len(bad)} invalid partition key(s); nothing was done. "
                + "; ".join(bad[:5])
                + f". Delete the dynamic partition(s) from the `{PARTITIONS_NAME}` partition "
                "set and import the posts under a valid tenant id."
            ),
            allow_retries=False,
        )
    return refs


def tenant_of(partition_key: str) -> str:
    """The tenant part of a key (unvalidated: for grouping keys already registered)."""
    return partition_key.partition("|")[2]


def tenant_partition_keys(tenant_id: str, level: int) -> list[str]:
    """The key strings of a tenant's ``2**level`` partitions, by number (validated once)."""
    validate_tenant_id(tenant_id)
    return [f"{s}|{tenant_id}" for s in SLICE_KEYS[: 1 << level]]


def partition_key_for(tenant_id: str, slice_name: str) -> str:
    """Key string of one tenant slice partition (the tenant id and slice are validated)."""
    validate_tenant_id(tenant_id)
    slice_no(slice_name)
    return f"{slice_name}|{tenant_id}"


def partition_keys(instance: dg.DagsterInstance) -> list[str]:
    """Every registered partition, in the instance's order (a run's range is a stretch of it)."""
    return list(instance.get_dynamic_partitions(PARTITIONS_NAME))


@contextlib.contextmanager
def listed_once(instance: dg.DagsterInstance) -> Iterator[None]:
    """While in-process runs execute, ``instance`` lists a dynamic partition set once.

    Dagster resolves a range run's keys from the whole list of dynamic partitions when it
    creates the run, and again at each step's start, output and ``context.partition_keys``:
    about ten reads of every registered key a run, so 20 runs over 10,000 tenants read 2
    million rows (6% of their CPU), and the cost per run grew with the tenant count. The runs
    of one command (``run_boxes``) cover boxes planned from partitions registered before
    the first run, so one read serves them all. Adding or deleting a key through
    ``instance`` drops the copy. Keys another process adds come after every key already
    listed (Dagster orders them by insertion), so they never fall inside a range; a key
    another process deletes (this project never does) stays listed until the runs end.
    Nested uses share the outer.
    """
    if "get_dynamic_partitions" in vars(instance):
        yield
        return
    read = instance.get_dynamic_partitions
    add = instance.add_dynamic_partitions
    delete = instance.delete_dynamic_partition
    listed: dict[str, list[str]] = {}

    def get_dynamic_partitions(partitions_def_name: str) -> Sequence[str]:
        if partitions_def_name not in listed:
            listed[partitions_def_name] = list(read(partitions_def_name))
        return list(listed[partitions_def_name])  # a copy: callers may change theirs

    def add_dynamic_partitions(partitions_def_name: str, partition_keys: Sequence[str]) -> None:
        listed.pop(partitions_def_name, None)
        add(partitions_def_name, partition_keys)

    def delete_dynamic_partition(partitions_def_name: str, partition_key: str) -> None:
        listed.pop(partitions_def_name, None)
        delete(partitions_def_name, partition_key)

    patched = {
        "get_dynamic_partitions": get_dynamic_partitions,
        "add_dynamic_partitions": add_dynamic_partitions,
        "delete_dynamic_partition": delete_dynamic_partition,
    }
    for name, fn in patched.items():
        setattr(instance, name, fn)
    try:
        yield
    finally:
        for name in patched:
            delattr(instance, name)


def ensure_partitions(instance: dg.DagsterInstance, levels: Mapping[str, int]) -> list[str]:
    """Register each tenant's partitions at its slice level (``tenant -> level``; idempotent;
    an invalid id raises before anything is registered). Levels only rise, so a tenant's
    partitions only grow: ``s00`` keeps its key, and the new ones are added after every
    registered key. Returns every partition in the instance's order (read once: thousands of
    tenants)."""
    return register(
        instance, [k for t in sorted(levels) for k in tenant_partition_keys(t, levels[t])]
    )


def register(instance: dg.DagsterInstance, keys: Sequence[str]) -> list[str]:
    """Register ``keys`` (validated first; those already there are left) and return every
    partition in the instance's order."""
    for key in keys:
        partition_ref(key)
    order = partition_keys(instance)
    known = set(order)
    new = [k for k in keys if k not in known]
    if not new:
        return order
    try:
        instance.add_dynamic_partitions(PARTITIONS_NAME, new)
    except sa.exc.IntegrityError:
        # Another process added some of them between our read and our insert (Dagster reads,
        # then inserts under a unique index): fine if every key is there now.
        missing = set(new) - set(partition_keys(instance))
        if missing:
            instance.add_dynamic_partitions(PARTITIONS_NAME, [k for k in new if k in missing])
    return partition_keys(instance)
