"""Dagster's materialisation rows, read without Dagster's deserialiser.

A check step points each evaluation at its partition's latest materialisation and reads that
materialisation's deferred count. Dagster's ``get_event_records`` deserialises each event whole:
about 190 us for a labels materialisation here (4 KB, ~20 metadata entries) against 10 us to
parse its JSON (orjson), 500 of them a check step. The row's JSON holds what the checks need:
the run, the event's timestamp and the integer metadata values. A body of another shape (a Dagster
upgrade) is left out, and the caller reads it Dagster's way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import sqlalchemy as sa

from backfill_assets.accelerators.dagster_private import (
    SqlEventLogStorage,
    SqlEventLogStorageTable,
)

# Values bound in one query of an instance's tables (ids, partition keys): SQLite builds before
# 3.32 take at most 999. Every chunked instance query here uses it.
VALUES_PER_QUERY = 900
_T = SqlEventLogStorageTable.c
# What a check needs of a materialisation: its run, its timestamp and its integer metadata.
Materialized = tuple[str, float, dict[str, int]]


def materializations(
    storage: SqlEventLogStorage, storage_ids: Sequence[int]
) -> dict[int, Materialized]:
    """The materialisations of ``storage_ids`` whose rows parse (the others are left out)."""
    out: dict[int, Materialized] = {}
    ids = list(storage_ids)
    with storage.index_connection() as conn:
        for i in range(0, len(ids), VALUES_PER_QUERY):
            query = sa.select(_T.id, _T.run_id, _T.event).where(
                _T.id.in_(ids[i : i + VALUES_PER_QUERY])
            )
            for storage_id, run_id, body in conn.execute(query):
                parsed = _parse(body)
                if parsed is not None:
                    out[int(storage_id)] = (str(run_id), *parsed)
    return out


def _parse(body: str) -> tuple[float, dict[str, int]] | None:
    """The timestamp and integer metadata of a serialised materialisation event (Dagster
    1.13's shape), or None."""
    try:
        # orjson: half json.loads's time; a body it refuses (NaN) is read Dagster's way.
        entry: Any = orjson.loads(body)
        if entry.get("__class__") != "EventLogEntry":
            return None
        data = entry["dagster_event"]["event_specific_data"]
        if data.get("__class__") != "StepMaterializationData":
            return None
        ints: dict[str, int] = {}
        for item in data["materialization"]["metadata_entries"]:
            value = item["entry_data"]
            if value.get("__class__") == "IntMetadataEntryData" and type(value["value"]) is int:
                ints[str(item["label"])] = value["value"]
        return float(entry["timestamp"]), ints
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
