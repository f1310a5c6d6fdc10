"""Keep the tenant partitions in step with the tenants in the store."""

from typing import Any

import dagster as dg

from backfill_assets.core.keys import TENANT_ID_RE
from backfill_assets.orchestration.partitions import tenant_partitions
from backfill_assets.orchestration.resources import StoreResource
from backfill_assets.store.engine import read_tx
from backfill_assets.store.reports import tenant_ids


@dg.sensor(minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING)
def tenant_partitions_sensor(
    context: dg.SensorEvaluationContext, store: StoreResource
) -> dg.SensorResult:
    """Registers tenants imported outside Dagster (e.g. by the CLI against another instance).

    Only ids that pass the import's rule become partitions: a row written into ``tenants`` by
    other means must not turn into a partition key (and from there into a lock path).
    """
    with read_tx(store.engine()) as conn:
        in_store = set(tenant_ids(conn))
    valid = {t for t in in_store if TENANT_ID_RE.fullmatch(t)}
    if invalid := sorted(in_store - valid):
        shown = ", ".join(repr(t[:48]) for t in invalid[:5])
        context.log.warning(
            f"{len(invalid)} tenant id(s) in the store are invalid and not registered: {shown}"
        )
    known = set(context.instance.get_dynamic_partitions(tenant_partitions.name or "tenants"))
    new = sorted(valid - known)
    return dg.SensorResult(
        dynamic_partitions_requests=[tenant_partitions.build_add_request(new)] if new else []
    )


def refresh_condition() -> dg.AutomationCondition[Any]:
    """Materialise when missing or when an upstream asset changed, never twice at once.

    Not ``eager()`` alone: it only reacts to changes after its first evaluation, and bin/dev
    imports the demo posts before the daemon's first tick, so the plan would stay missing.
    """
    return (
        dg.AutomationCondition.missing() | dg.AutomationCondition.any_deps_updated()
    ) & ~dg.AutomationCondition.in_progress()


# Evaluates the reporting assets' conditions (backfill_plan after an import, tenant_usage
# after label runs). Dagster's implicit default sensor starts stopped on a fresh instance, so
# nothing would refresh until someone turned it on in the UI.
reporting_automation = dg.AutomationConditionSensorDefinition(
    "reporting_automation",
    target=dg.AssetSelection.groups("reporting"),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=15,
    description="Refreshes backfill_plan and tenant_usage when what they read has changed.",
)
