"""Tenant x slice partitions of the moderation assets."""

from __future__ import annotations

import dagster as dg

from .keys import SLICE_KEYS, slice_no
from .pipeline import PartitionRef

tenant_partitions = dg.DynamicPartitionsDefinition(name="tenants")
slice_partitions = dg.StaticPartitionsDefinition(list(SLICE_KEYS))
moderation_partitions = dg.MultiPartitionsDefinition(
    {"tenant": tenant_partitions, "slice": slice_partitions}
)


def partition_ref(partition_key: str) -> PartitionRef:
    """Parse a multi-partition key string (``"s03|acme"``) into a reference."""
    mpk = moderation_partitions.get_partition_key_from_str(partition_key)
    dims = mpk.keys_by_dimension
    return PartitionRef(
        key=str(partition_key), tenant_id=dims["tenant"], slice=slice_no(dims["slice"])
    )


def partition_key_for(tenant_id: str, slice_key: str) -> str:
    """Key string of one tenant x slice partition."""
    return str(dg.MultiPartitionKey({"tenant": tenant_id, "slice": slice_key}))
