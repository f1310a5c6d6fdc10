"""Refuse runs whose partition range Dagster resolved to a single partition.

Dagster 1.13.27's *job* backfills (launched from a job's page, or through GraphQL with a
partition-set selector) copy the first partition's ``dagster/partition/<dimension>`` tags onto
every range run of a multi-partitioned job. The run then resolves to that one partition, yet
the backfill reports the whole range as done. Asset backfills (asset page, asset graph,
``backfill-moderation launch``) are not affected. Failing loudly turns the silent gap into a
failed partition an operator can see and re-run the right way.
"""

import dagster as dg

RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"


class RangeCollapsed(dg.Failure):
    """The run's range tags name several partitions but it resolved to one."""


def require_full_range(context: dg.AssetExecutionContext) -> None:
    """Raise ``RangeCollapsed`` when the run covers fewer partitions than its range tags."""
    tags = context.run.tags
    start, end = tags.get(RANGE_START), tags.get(RANGE_END)
    if start is None or end is None or start == end or len(context.partition_keys) != 1:
        return
    raise RangeCollapsed(
        description=(
            f"this run is tagged with the range {start}..{end} but Dagster resolved it to the "
            f"single partition {context.partition_keys[0]} (a job backfill of a "
            "multi-partitioned job, Dagster 1.13); nothing was done. Launch backfills from the "
            "asset page or with `backfill-moderation launch` instead."
        ),
        allow_retries=False,
    )
