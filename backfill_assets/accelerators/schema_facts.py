"""Dagster's questions about its own schema, answered once a storage: what is there stays.

Dagster 1.13's SQL storages ask the database whether a table or column exists before many
reads and writes, to work on instances not yet migrated: ``has_table`` before each batch of
asset-event tags and each dynamic-partition lookup, the asset table's columns before each
asset-records read, the runs table's columns before each run record read and each run event.
Each question is a reflection query (two catalog queries on PostgreSQL, each planned anew),
often on a connection of its own. A CLI ``run`` of 10,000 small tenants (20 Dagster runs) sent
249 ``pg_attribute`` and 425 ``pg_class`` queries (``pg_stat_statements``).

A table or column, once there, stays there (a migration adds them; nothing here drops them,
and Dagster caches some of these answers itself, e.g. ``has_secondary_index``), so a yes is
remembered for the storage's life. A no is asked again: ``dagster instance migrate`` in
another process may add it at any time.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

if TYPE_CHECKING:
    from backfill_assets.accelerators.dagster_private import SqlEventLogStorage, SqlRunStorage

    _EventLogBase = SqlEventLogStorage
    _RunBase = SqlRunStorage
else:
    _EventLogBase = object
    _RunBase = object


class KnownSchema:
    """The schema facts a storage has seen to be true."""

    def __init__(self) -> None:
        self._true: set[Hashable] = set()

    def ask(self, fact: Hashable, question: Callable[[], bool]) -> bool:
        """``question()``'s answer, asked again only until it was yes once."""
        if fact in self._true:
            return True
        answer = question()
        if answer:
            self._true.add(fact)
        return answer


def _known(storage: Any) -> KnownSchema:
    # Dagster's constructors ask before a subclass's ``__init__`` body runs after ``super()``.
    known: KnownSchema | None = storage.__dict__.get("_known_schema")
    if known is None:
        known = storage.__dict__["_known_schema"] = KnownSchema()
    return known


class EventLogSchemaFacts(_EventLogBase):
    """For a ``SqlEventLogStorage`` subclass (listed before it): its tables and the asset
    table's columns, remembered once there."""

    def has_table(self, table_name: str) -> bool:
        """Dagster's answer; a yes remembered."""
        # Abstract in SqlEventLogStorage; the storage this is mixed into implements it.
        dagster = super().has_table  # type: ignore[safe-super]
        return _known(self).ask(("table", table_name), lambda: dagster(table_name))

    def has_asset_key_col(self, column_name: str) -> bool:
        """Dagster's answer (a connection of its own); a yes remembered."""
        dagster = super().has_asset_key_col
        return _known(self).ask(("asset_keys", column_name), lambda: dagster(column_name))

    def _has_asset_key_col_on_connection(self, conn: Connection, column_name: str) -> bool:
        dagster = super()._has_asset_key_col_on_connection
        return _known(self).ask(("asset_keys", column_name), lambda: dagster(conn, column_name))


class RunSchemaFacts(_RunBase):
    """For a ``SqlRunStorage`` subclass (listed before it): the runs and backfills tables'
    later columns and tables, remembered once there."""

    def has_run_stats_index_cols(self) -> bool:
        """Dagster's answer; a yes remembered."""
        return _known(self).ask("run_stats_index_cols", super().has_run_stats_index_cols)

    def has_backfill_id_column(self) -> bool:
        """Dagster's answer; a yes remembered."""
        return _known(self).ask("backfill_id_column", super().has_backfill_id_column)

    def has_bulk_actions_selector_cols(self) -> bool:
        """Dagster's answer; a yes remembered."""
        return _known(self).ask(
            "bulk_actions_selector_cols", super().has_bulk_actions_selector_cols
        )

    def has_bulk_action_job_name_column(self) -> bool:
        """Dagster's answer; a yes remembered."""
        return _known(self).ask(
            "bulk_action_job_name_column", super().has_bulk_action_job_name_column
        )

    def has_backfill_tags_table(self) -> bool:
        """Dagster's answer; a yes remembered."""
        return _known(self).ask("backfill_tags_table", super().has_backfill_tags_table)
