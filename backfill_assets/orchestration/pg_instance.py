"""``backfill_assets.orchestration.pg_instance.BatchingPostgresStorage``, as old homes name it."""

from backfill_assets.accelerators.pg_instance import BatchingPostgresStorage

__all__ = ["BatchingPostgresStorage"]
