"""Units of work: keys, records, columns, outcomes, event kinds, regions (pure).

The names the CLI uses are handed on here, so it imports the package, not its modules."""

from __future__ import annotations

from backfill_assets.domain.work.columns import ColumnMap, ColumnMapError
from backfill_assets.domain.work.keys import (
    SLICE_COUNT,
    SLICE_KEYS,
    InvalidTenantId,
    slice_key,
    slice_no,
    validate_tenant_id,
)
from backfill_assets.domain.work.regions import (
    InvalidRegion,
    base_url_var,
    run_tags,
    validate_region,
)

__all__ = [
    "SLICE_COUNT",
    "SLICE_KEYS",
    "ColumnMap",
    "ColumnMapError",
    "InvalidRegion",
    "InvalidTenantId",
    "base_url_var",
    "run_tags",
    "slice_key",
    "slice_no",
    "validate_region",
    "validate_tenant_id",
]
