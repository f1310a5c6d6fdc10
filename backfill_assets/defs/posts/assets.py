"""The ``posts`` asset: an import from the UI, of an export file or of the database source the
environment names (``BACKFILL_SOURCE_URL``, ``_QUERY``, ``_CURSOR``), and the schedule that
repeats it for incremental imports (shipped stopped).

The source is closed over when the definitions are built, never resource or run config: a
launch cannot point the import at another database, and the URL (a secret) is in no config
Dagster stores or shows.
"""

from pathlib import Path
from typing import Any

import dagster as dg

from backfill_assets.config.variables import StoreSettings
from backfill_assets.defs.asset_keys import POSTS
from backfill_assets.defs.partitions import ensure_partitions
from backfill_assets.defs.resources import RunResource
from backfill_assets.defs.sealing import launch_field
from backfill_assets.ingest.importer import ImportInputError, files_within, import_files
from backfill_assets.ledger.engine import read_tx
from backfill_assets.ledger.engines import store_engine
from backfill_assets.ledger.run.posts import ImportSummary, slice_levels
from backfill_assets.platform_db.sql_import import SqlSource, import_sql

IMPORT_JOB = "import_posts"
INCREMENTAL_SCHEDULE = "incremental_import"
# The name of the environment's source in the store (its mark, its rejects): the CLI's
# ``import --sql ... --source posts_asset`` continues the same mark.
ENV_SOURCE_NAME = "posts_asset"


# The one field a launch may set: a literal string (never {"env": ...}), see sealing.py.
PATH_FIELD = "path"
POSTS_CONFIG = {
    PATH_FIELD: launch_field(
        ".",
        "Which export to import: a file or directory relative to BACKFILL_IMPORT_DIR (default: "
        "the bundled demo export's directory), or absolute inside it; nothing outside it is "
        "read. Not used when the environment names a database source.",
    )
}


def build_posts(source: SqlSource | None) -> dg.AssetsDefinition:
    """The posts asset; with ``source`` it imports from that database instead of a file."""

    @dg.asset(key=POSTS, group_name="ingest", kinds={"sql"}, config_schema=POSTS_CONFIG)
    def posts(
        context: dg.AssetExecutionContext,
        store: dg.ResourceParam[StoreSettings],
        settings: dg.ResourceParam[RunResource],
    ) -> dg.MaterializeResult[None]:
        """Posts imported from an export or the configured source; bad rows go to
        rejected_records (location, reason, never the text)."""
        target = settings.run.slice_target_posts
        extra: dict[str, dg.MetadataValue[Any]] = {}
        try:
            if source is not None:
                done = import_sql(store_engine(store), source, slice_target=target)
                summary = done.summary
                extra["source"] = dg.MetadataValue.text(source.label)
                mark = done.high_water()
                if mark is not None:
                    extra["high_water"] = dg.MetadataValue.json(mark)
            else:
                files = _launch_files(context, settings)
                summary = ImportSummary()
                for _f, one in import_files(store_engine(store), files, slice_target=target):
                    summary.add(one)
                names = ", ".join(f.name for f in files[:20])
                extra["source"] = dg.MetadataValue.text(names)
        except ImportInputError as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from None
        fresh = _register_partitions(context, store, summary)
        counts = summary.as_dict()
        metadata: dict[str, dg.MetadataValue[Any]] = {
            k: dg.MetadataValue.int(int(str(counts[k])))
            for k in ("read", "imported", "updated", "unchanged", "rejected")
        }
        metadata.update(extra)
        metadata["new_tenants"] = dg.MetadataValue.text(", ".join(fresh) or "-")
        return dg.MaterializeResult(metadata=metadata)

    return posts


def _launch_files(context: dg.AssetExecutionContext, settings: RunResource) -> list[Path]:
    """The files the launch's ``path`` names inside the import directory; a refusal names the
    field and the reason (``files_within`` never repeats the value)."""
    try:
        return files_within(context.op_config[PATH_FIELD], settings.import_root())
    except ImportInputError as exc:
        raise ImportInputError(f"ops.posts.config.{PATH_FIELD}: {exc}") from None


def _register_partitions(
    context: dg.AssetExecutionContext, store: StoreSettings, summary: ImportSummary
) -> list[str]:
    """Register the partitions of every tenant the import touched (a tenant that grew past
    its slice level gets its new slices); returns the new tenants."""
    with read_tx(store_engine(store)) as conn:
        levels = slice_levels(conn, summary.tenants_seen)
    ensure_partitions(context.instance, levels)
    return sorted(summary.new_tenants)


def build_incremental_schedule(
    posts: dg.AssetsDefinition, source: SqlSource | None, cron: str
) -> tuple[Any, dg.ScheduleDefinition]:
    """The import job and its schedule, stopped until an operator starts it; without a
    source in the environment every tick is skipped (nothing would be incremental)."""
    job = dg.define_asset_job(
        IMPORT_JOB,
        selection=dg.AssetSelection.assets(posts),
        description="Import posts (from BACKFILL_SOURCE_URL when it is set).",
    )

    @dg.schedule(
        name=INCREMENTAL_SCHEDULE,
        cron_schedule=cron,
        job=job,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Incremental import from the BACKFILL_SOURCE_* database (off by default).",
    )
    def incremental_import(
        context: dg.ScheduleEvaluationContext,
    ) -> dg.RunRequest | dg.SkipReason:
        if source is None:
            return dg.SkipReason("BACKFILL_SOURCE_URL is not set: there is no source to follow")
        return dg.RunRequest(run_key=None, tags={"import": source.label})

    return job, incremental_import
