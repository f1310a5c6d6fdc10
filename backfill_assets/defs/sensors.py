"""Keep the tenant partitions in step with the tenants in the store."""

from typing import Any

import dagster as dg

from backfill_assets.config.variables import StoreSettings
from backfill_assets.defs.partitions import (
    moderation_partitions,
    partition_keys,
    tenant_partition_keys,
)
from backfill_assets.domain.work.keys import TENANT_ID_RE
from backfill_assets.ledger.engine import read_tx
from backfill_assets.ledger.engines import store_engine
from backfill_assets.ledger.run.posts import slice_levels


@dg.sensor(minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING)
def tenant_partitions_sensor(
    context: dg.SensorEvaluationContext, store: dg.ResourceParam[StoreSettings]
) -> dg.SensorResult:
    """Registers the partitions of tenants imported or grown outside Dagster (e.g. by the CLI
    against another instance): each tenant's slices at its level, nothing more.

    Only ids that pass the import's rule become partitions: a row written into ``tenants`` by
    other means must not turn into a partition key (and from there into a lock path).
    """
    with read_tx(store_engine(store)) as conn:
        levels = slice_levels(conn, None)
    valid = {t: lvl for t, lvl in levels.items() if TENANT_ID_RE.fullmatch(t)}
    if invalid := sorted(set(levels) - set(valid)):
        shown = ", ".join(repr(t[:48]) for t in invalid[:5])
        context.log.warning(
            f"{len(invalid)} tenant id(s) in the store are invalid and not registered: {shown}"
        )
    known = set(partition_keys(context.instance))
    new = [k for t in sorted(valid) for k in tenant_partition_keys(t, valid[t]) if k not in known]
    return dg.SensorResult(
        dynamic_partitions_requests=[moderation_partitions.build_add_request(new)] if new else []
    )


def refresh_condition() -> dg.AutomationCondition[Any]:
    """Materialise when missing or when an upstream asset changed, never twice at once.

    Not ``eager()`` alone: it only reacts to changes after its first evaluation, and bin/dev
    imports the demo posts before the daemon's first tick, so the plan would stay missing.
    """
    return (
        dg.AutomationCondition.missing() | dg.AutomationCondition.any_deps_updated()
    ) & ~dg.AutomationCondition.in_progress()


# Evaluates the reporting assets' conditions (backfill_plan after an import, tenant_usage and
# review_queue after label runs). Dagster's implicit default sensor starts stopped on a fresh
# instance, so nothing would refresh until someone turned it on in the UI.
reporting_automation = dg.AutomationConditionSensorDefinition(
    "reporting_automation",
    target=dg.AssetSelection.groups("reporting"),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=15,
    description="Refreshes backfill_plan, tenant_usage and review_queue when what they read "
    "has changed.",
)
