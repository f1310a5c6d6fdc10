"""``backfill_assets.orchestration.sqlite_instance.EmbeddedInstance``, as old homes name it."""

from backfill_assets.accelerators.sqlite_instance import EmbeddedInstance

__all__ = ["EmbeddedInstance"]
