"""Keep the tenant partitions in step with the tenants in the store."""

import dagster as dg

from .partitions import tenant_partitions
from .resources import StoreResource
from .store.engine import read_tx
from .store.reports import tenant_ids


@dg.sensor(minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING)
def tenant_partitions_sensor(
    context: dg.SensorEvaluationContext, store: StoreResource
) -> dg.SensorResult:
    """Registers tenants imported outside Dagster (e.g. by the CLI against another instance)."""
    with read_tx(store.engine()) as conn:
        in_store = set(tenant_ids(conn))
    known = set(context.instance.get_dynamic_partitions(tenant_partitions.name or "tenants"))
    new = sorted(in_store - known)
    return dg.SensorResult(
        dynamic_partitions_requests=[tenant_partitions.build_add_request(new)] if new else []
    )
