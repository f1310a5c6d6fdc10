"""A range run's per-partition metadata handed to the step's accumulator in one step.

``context.add_asset_metadata(partition_key=...)`` lists the run's whole range again on every
call, and over the dynamic tenant dimension that is three instance queries per call (a new
SQLite connection each): 11 s of a 100-partition run here. The keys are checked once against
the run's partition keys by the caller (``defs/instance_api.py``) and handed here to the step's
metadata accumulator, which is what that method does after its check (Dagster 1.13.27), in one
step. Dagster's private internals: if they are not there, the caller uses the public method.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from backfill_assets.accelerators.dagster_private import AssetMetadataHandle


def add_in_one_step(
    context: dg.AssetExecutionContext, by_partition: Mapping[str, Mapping[str, Any]]
) -> bool:
    """Attach each partition's metadata to its materialisation; False (nothing done) when the
    step's accumulator is not where Dagster 1.13.27 keeps it."""
    step: Any = getattr(context.op_execution_context, "_step_execution_context", None)
    accumulator = getattr(step, "_metadata_accumulator", None)
    if accumulator is None or not hasattr(accumulator, "per_output_metadata"):
        return False
    # One new accumulator for all of them: ``with_additional_asset_metadata`` copies the whole
    # mapping for each partition (500 partitions: 125,000 entries copied).
    asset_key = context.assets_def.key
    merged = dict(accumulator.per_output_metadata)
    for pk, metadata in by_partition.items():
        handle = AssetMetadataHandle(asset_key=asset_key, partition_key=pk)
        merged[handle] = {**merged.get(handle, {}), **metadata}
    step._metadata_accumulator = type(accumulator)(per_output_metadata=merged)
    return True
