"""``sink ddl``, ``sink check`` and ``sink write``: the platform table that
``applied_labels`` writes labels back into (``BACKFILL_SINK_URL``, ``BACKFILL_SINK_TABLE``)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from backfill_assets.cli.inputs import known_tenants
from backfill_assets.cli.parsers import command_group
from backfill_assets.cli.tables import emit
from backfill_assets.domain.errors import UserError
from backfill_assets.domain.work import slice_key

if TYPE_CHECKING:
    from backfill_assets.config.settings import Settings


def add_sink_commands(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Register the ``sink`` group: ``ddl``, ``check`` and ``write``."""
    child = command_group(
        add,
        "sink",
        "The platform table labels are written back into: ddl, check, write.",
        "sink_command",
    )

    sp = child(
        "ddl",
        "Print CREATE TABLE for BACKFILL_SINK_TABLE, for an operator to review and run "
        "(nothing is created).",
    )
    sp.add_argument(
        "--dialect",
        help="SQL dialect (default: BACKFILL_SINK_URL's, else postgresql)",
    )
    sp.set_defaults(func=cmd_sink_ddl)
    sp = child(
        "check",
        "Check that BACKFILL_SINK_TABLE exists in BACKFILL_SINK_URL with every column and a "
        "unique key on (tenant_id, post_id, policy_id); exit 2 saying what is wrong.",
    )
    sp.set_defaults(func=cmd_sink_check)
    sp = child(
        "write",
        "Write back every partition whose applied labels are not all in the sink yet (what "
        "`verify` lists), without a run: after a sink outage, or when a sink is added.",
    )
    sp.add_argument("--tenant", action="append", default=[], help="tenant id (repeatable)")
    sp.add_argument(
        "--all",
        action="store_true",
        help="every applied partition, recorded as written or not (a table recreated or "
        "emptied on the platform's side); rows already there are left as they are",
    )
    sp.set_defaults(func=cmd_sink_write)


def cmd_sink_ddl(args: argparse.Namespace, settings: Settings) -> int:
    """The sink table's DDL for the dialect asked for, or the sink's, or PostgreSQL's."""
    from backfill_assets.runner.api import ddl
    from backfill_assets.runner.queries import database_url

    dialect = args.dialect
    if dialect is None and settings.data.sink_url:
        try:
            dialect = database_url(settings.data.sink_url).get_backend_name()
        except ValueError as exc:
            raise UserError(f"BACKFILL_SINK_URL {exc}") from None
    try:
        text = ddl(settings.data.sink_table, dialect or "postgresql")
    except ValueError as exc:
        raise UserError(f"argument --dialect: {exc}") from None
    emit(
        args,
        {"table": settings.data.sink_table, "dialect": dialect or "postgresql", "ddl": text},
        text,
    )
    return 0


def cmd_sink_check(args: argparse.Namespace, settings: Settings) -> int:
    """Exit 0 when the sink can be written, else 2 listing every problem."""
    from backfill_assets.runner.api import SinkError, check, sink_of

    sink = sink_of(settings.data)
    if sink is None:
        raise UserError("BACKFILL_SINK_URL is not set: there is no sink to check")
    try:
        problems = check(sink)
    except SinkError as exc:
        raise UserError(str(exc)) from None
    if problems:
        raise UserError(f"{sink.name}: " + "; ".join(problems))
    emit(args, {"sink": sink.name, "ok": True}, f"{sink.name}: OK")
    return 0


def cmd_sink_write(args: argparse.Namespace, settings: Settings) -> int:
    """Write back the partitions with a gap; exit 1 if the sink refuses one (the rest waits)."""
    from backfill_assets.runner.api import (
        PartitionRef,
        gap_partitions,
        partition_key_for,
        sink_of,
        write_back,
    )
    from backfill_assets.runner.queries import read_tx, store_engine, tenant_ids

    sink = sink_of(settings.data)
    if sink is None:
        raise UserError("BACKFILL_SINK_URL is not set: there is no sink to write to")
    engine = store_engine(settings.store)
    policy = settings.rubric().policy
    with read_tx(engine) as conn:
        tenants = known_tenants(args.tenant, tenant_ids(conn))
        # No sink has the id "": every applied partition is a gap of it.
        sink_id = "" if args.all else sink.sink_id
        found = gap_partitions(conn, sink_id, policy.key_version, tenants or None)
    refs = [
        PartitionRef(partition_key_for(t, slice_key(n)), t, n, level)
        for t, n, level in sorted(found)
    ]
    started = time.perf_counter()
    written, failed = write_back(engine, sink, refs, policy, only_gaps=False)
    seconds = time.perf_counter() - started
    rows = sum(r.rows for r in written.values())
    doc = {
        "sink": sink.name,
        "partitions": len(written),
        "partitions_pending": len(refs),
        "rows": rows,
        "changed": sum(r.changed for r in written.values()),
        "seconds": round(seconds, 3),
        "rows_per_s": round(rows / seconds) if seconds > 0 else 0,
        "error": None if failed is None else str(failed),
    }
    text = (
        f"{sink.name}: {rows:,} row(s) of {len(written)} of {len(refs)} partition(s) written "
        f"back, {doc['changed']:,} new or changed, in {seconds:.1f} s"
    )
    emit(args, doc, text, *([f"FAILED: {failed}"] if failed else []))
    return 1 if failed else 0
