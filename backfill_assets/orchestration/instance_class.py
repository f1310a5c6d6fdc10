"""``backfill_assets.orchestration.instance_class.BackfillInstance``, as old homes name it."""

from backfill_assets.accelerators.instance_class import BackfillInstance

__all__ = ["BackfillInstance"]
