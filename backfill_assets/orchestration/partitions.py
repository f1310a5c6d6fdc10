"""Tenant x slice partitions of the moderation assets.

Partition keys come from outside the code: the UI's "add partition" box, a sensor, the GraphQL
API, run tags. Every key is parsed here, with the same tenant rule as the import, before any
tenant id reaches a path, a lock or a query.
"""

from __future__ import annotations

from collections.abc import Iterable

import dagster as dg

from backfill_assets.core.keys import SLICE_KEYS, InvalidTenantId, slice_no, validate_tenant_id
from backfill_assets.dispatch.partition_run import PartitionRef

tenant_partitions = dg.DynamicPartitionsDefinition(name="tenants")
slice_partitions = dg.StaticPartitionsDefinition(list(SLICE_KEYS))
moderation_partitions = dg.MultiPartitionsDefinition(
    {"tenant": tenant_partitions, "slice": slice_partitions}
)


class InvalidPartitionKey(ValueError):
    """A partition key that is not ``s<NN>|<valid tenant id>``."""


def partition_ref(partition_key: str) -> PartitionRef:
    """Parse and validate a multi-partition key string (``"s03|acme"``)."""
    shown = repr(str(partition_key)[:64])
    try:
        dims = moderation_partitions.get_partition_key_from_str(partition_key).keys_by_dimension
        tenant_id = validate_tenant_id(dims["tenant"])
        number = slice_no(dims["slice"])
    except InvalidTenantId as exc:
        raise InvalidPartitionKey(
            f"partition {shown}: {exc} (tenant ids match ^[a-z0-9][a-z0-9-]{{0,39}}$)"
        ) from None
    except Exception as exc:  # Dagster's own parse errors are CheckErrors, not ValueErrors
        raise InvalidPartitionKey(f"partition {shown}: {exc}") from None
    if partition_key_for(tenant_id, dims["slice"]) != partition_key:
        raise InvalidPartitionKey(f"partition {shown} is not in canonical form")
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
                + ". Delete the dynamic partition(s) from the `tenants` partition set and "
                "import the posts under a valid tenant id."
            ),
            allow_retries=False,
        )
    return refs


def tenant_partition_keys(tenant_id: str) -> list[str]:
    """The key strings of a tenant's 16 partitions, by slice number (validated once): what
    ``partition_key_for`` gives, without building a key object per partition."""
    validate_tenant_id(tenant_id)
    # Dagster joins a multi-partition key's values in the order of its dimension names.
    return [f"{s}|{tenant_id}" for s in SLICE_KEYS]


def partition_key_for(tenant_id: str, slice_key: str) -> str:
    """Key string of one tenant x slice partition (the tenant id is validated)."""
    validate_tenant_id(tenant_id)
    slice_no(slice_key)
    return str(dg.MultiPartitionKey({"tenant": tenant_id, "slice": slice_key}))
