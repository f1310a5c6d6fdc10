"""``import`` (JSONL, CSV or Parquet exports, a directory of them, or a database query) and
``rejects``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backfill_assets.cli.inputs import choice, known_value
from backfill_assets.cli.numbers import count
from backfill_assets.cli.process import freeze_heap
from backfill_assets.cli.progress import ProgressDisplay, wanted
from backfill_assets.cli.tables import Human, emit, table, tell
from backfill_assets.domain.errors import UserError
from backfill_assets.domain.work import (
    ColumnMap,
    ColumnMapError,
    InvalidTenantId,
    validate_tenant_id,
)
from backfill_assets.ingest.formats import FORMATS, Format

if TYPE_CHECKING:
    from backfill_assets.config.settings import Settings
    from backfill_assets.runner.api import ImportOptions, SqlImport, SqlSource
    from backfill_assets.runner.queries import ImportSummary

IMPORT_COLUMNS = ["file", "read", "imported", "updated", "unchanged", "rejected"]
REJECT_COLUMNS = ["source", "line", "locator", "tenant", "reason", "at"]


def add_ingest_commands(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Register ``import`` and ``rejects``."""
    sp = add(
        "import",
        "Stream exports (JSONL, CSV, Parquet; a file or a directory) or a query's rows into posts.",
    )
    sp.add_argument(
        "path",
        nargs="?",
        help="a JSONL, CSV (.gz or not) or Parquet file with tenant_id, post_id and text, or a "
        "directory: its *.jsonl, *.csv (and .gz) and *.parquet files in name order",
    )
    sp.add_argument(
        "--format",
        type=choice("format", FORMATS),
        default=None,
        help="jsonl, csv or parquet (default: decided by each file's content)",
    )
    sp.add_argument(
        "--map",
        default=None,
        metavar="FIELD=COLUMN,...",
        help="read fields from other columns: tenant_id=workspace,post_id=id,text=body",
    )
    sp.add_argument(
        "--tenant",
        default=None,
        help="bind the import to one tenant: rows naming another are rejected, rows naming "
        "none are this tenant's (the safe way to import a per-tenant export)",
    )
    sp.add_argument("--sql", default=None, metavar="URL", help="import from this database")
    sp.add_argument("--query", default=None, help="with --sql: the SELECT that returns the posts")
    sp.add_argument(
        "--source", default=None, help="with --sql: the source's name (its rejects, its mark)"
    )
    sp.add_argument(
        "--cursor",
        default=None,
        metavar="COLUMN",
        help="with --sql: read only rows from the last import's COLUMN value on (that value again)",
    )
    sp.set_defaults(func=cmd_import)

    sp = add("rejects", "List rejected import lines: file, line, reason and when (never text).")
    sp.add_argument("--tenant", default=None, help="only lines that gave this tenant value")
    sp.add_argument("--file", default=None, help="only lines of this file (path or file name)")
    sp.add_argument(
        "--limit", type=count(0, 10**9), default=1000, help="rows listed, 0 to 10^9 (0: all)"
    )
    sp.set_defaults(func=cmd_rejects)


def rejects_hint(n: int) -> str:
    """The one line that points at ``rejects`` after an import."""
    return f"{n} line{'' if n == 1 else 's'} rejected, see `backfill-moderation rejects`"


def _options(args: argparse.Namespace) -> ImportOptions:
    from backfill_assets.runner.api import ImportOptions

    try:
        columns = ColumnMap.parse(args.map)
    except ColumnMapError as exc:
        raise UserError(f"argument --map: {exc}") from None
    fmt: Format | None = args.format
    return ImportOptions(columns=columns, tenant=bound_tenant(args.tenant), format=fmt)


def bound_tenant(value: str | None) -> str | None:
    """``--tenant``'s value, checked (an import bound to one tenant), or ``None``."""
    if value is None:
        return None
    try:
        return validate_tenant_id(value)
    except InvalidTenantId as exc:
        raise UserError(f"argument --tenant: {exc}") from None


def from_sql(
    args: argparse.Namespace, sql_only: Mapping[str, object], required: Sequence[str], hint: str
) -> bool:
    """Whether an import reads ``--sql`` (True) or its PATH (False), for ``import``,
    ``decisions import`` and ``baseline import`` alike: ``sql_only`` are the flags (and their
    values) that only go with ``--sql``, ``required`` those it needs, ``hint`` the message
    when neither a PATH nor ``--sql`` is given."""
    if args.sql is None:
        given = [flag for flag, value in sql_only.items() if value is not None]
        if given:
            raise UserError(f"argument {given[0]}: only with --sql")
        if args.path is None:
            raise UserError(hint)
        return False
    if args.path is not None:
        raise UserError("give either a PATH or --sql, not both")
    if args.format is not None:
        raise UserError("argument --format: not with --sql (a query's rows have no format)")
    for flag in required:
        if sql_only[flag] is None:
            raise UserError(f"argument {flag}: required with --sql")
    return True


def _sql_source(args: argparse.Namespace) -> SqlSource | None:
    """The database source the flags name, or ``None`` for an import of files."""
    from backfill_assets.runner.api import SqlSource

    sql_only = {"--query": args.query, "--source": args.source, "--cursor": args.cursor}
    hint = "give a PATH to import, or --sql URL --query ... --source NAME"
    if not from_sql(args, sql_only, ("--query", "--source"), hint):
        return None
    return SqlSource(url=args.sql, query=args.query, name=args.source, cursor=args.cursor)


def cmd_import(args: argparse.Namespace, settings: Settings) -> int:
    """Import files, a directory or a query's rows; register new tenants as partitions."""
    from backfill_assets.runner.api import (
        ImportInputError,
        ensure_partitions,
        export_files,
        import_files,
        import_sql,
        instance,
        record_import,
    )
    from backfill_assets.runner.queries import ImportSummary, read_tx, slice_levels, store_engine

    freeze_heap()  # what the runner loaded lives until the end (process.py)

    options = _options(args)
    source = _sql_source(args)
    files: list[Path] = []
    if source is None:
        try:
            files = export_files(Path(args.path))
        except ImportInputError as exc:
            raise UserError(str(exc)) from None
    engine = store_engine(settings.store)
    done: list[tuple[str, ImportSummary]] = []
    from_sql: SqlImport | None = None
    with ProgressDisplay("lines", enabled=wanted(args.json)) as display:

        def progress(label: str, s: ImportSummary) -> None:
            display.update(label, s.read, imported=s.imported, rejected=s.rejected)

        try:
            target = settings.run.slice_target_posts
            if source is not None:
                from_sql = import_sql(engine, source, progress, target, options)
                done = [(source.label, from_sql.summary)]
            else:
                done = [
                    (f.name, s) for f, s in import_files(engine, files, progress, target, options)
                ]
        except ImportInputError as exc:
            raise UserError(str(exc)) from None
        finally:
            # Also after a corrupt file: the posts committed before it need their partitions.
            with read_tx(engine) as conn:
                levels = slice_levels(conn, None)
            ensure_partitions(instance(settings), levels)
    total = ImportSummary()
    for _, s in done:
        total.add(s)
    record_import(instance(settings), source.label if source else args.path, total)
    rows = [{"file": name, **_counts(s)} for name, s in done]
    if len(rows) > 1:
        rows.append({"file": f"total ({len(rows)} files)", **_counts(total)})
    human: list[Human] = [table(rows, IMPORT_COLUMNS)]
    if total.new_tenants:
        human.append(f"new tenants: {', '.join(sorted(total.new_tenants))}")
    doc = total.as_dict()
    if from_sql is not None and source is not None:
        doc["source"] = source.name
        doc["high_water"] = from_sql.high_water()
        if from_sql.high_water() is not None:
            mark = ", ".join(f"{k} {v}" for k, v in (from_sql.high_water() or {}).items() if v)
            human.append(f"high-water mark: {mark}")
    emit(args, doc, *human)
    if total.new_rejects and not args.json:
        # On stderr, and only for lines not recorded before: re-importing the same file
        # (as bin/dev does at every start) does not repeat it.
        tell(rejects_hint(total.new_rejects))
    return 0


def _counts(s: ImportSummary) -> dict[str, Any]:
    return {k: v for k, v in s.as_dict().items() if k != "new_tenants"}


def cmd_rejects(args: argparse.Namespace, settings: Settings) -> int:
    """Rejected lines with their source, line number, reason and time; never their text."""
    from backfill_assets.runner.queries import (
        list_rejects,
        read_tx,
        reject_sources,
        rejected_tenant_values,
        store_engine,
        tenant_ids,
    )

    engine = store_engine(settings.store)
    with read_tx(engine) as conn:
        sources = reject_sources(conn)
        if args.tenant is not None:
            tenant_values = sorted({*tenant_ids(conn), *rejected_tenant_values(conn)})
            known_value([args.tenant], tenant_values, "tenant", "--tenant")
        chosen = _sources_for(args.file, sources) if args.file is not None else []
        page = list_rejects(conn, args.tenant, chosen, limit=args.limit)
    doc = {"rejects": page.rows, "total": page.total}
    human: list[Human] = [table(page.rows, REJECT_COLUMNS)]
    if page.total > len(page.rows):
        human.append(f"{page.total - len(page.rows)} more; --limit 0 lists all")
    else:
        human.append(f"{page.total} rejected line{'' if page.total == 1 else 's'}")
    emit(args, doc, *human)
    return 0


def _sources_for(given: str, sources: list[str]) -> list[str]:
    """Sources ``--file`` names: the same path (relative or not) or the same file name.

    A file that exists but has no rejected lines lists nothing; a name that is neither a
    file nor a source with rejects is a typo (exit 2, with the closest file names).
    """
    path = Path(given)
    try:
        exact = {given, str(path.resolve())}
        is_file = path.is_file()
    except (OSError, ValueError):  # a name too long for the file system, a NUL
        exact, is_file = {given}, False
    chosen = [s for s in sources if s in exact or Path(s).name == given]
    if chosen or is_file:
        return chosen or [str(path.resolve())]
    names = sorted({Path(s).name for s in sources})
    known_value([path.name or given], names, "file", "--file")
    raise UserError(f"argument --file: {given}: no such file, and no rejected lines from it")
