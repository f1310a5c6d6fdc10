"""``import`` (a JSONL export, gzip or not, or a directory of them) and ``rejects``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from backfill_assets.cli.commands import emit
from backfill_assets.cli.inputs import UserError, known_value
from backfill_assets.cli.instance import instance
from backfill_assets.cli.progress import ProgressDisplay, wanted
from backfill_assets.cli.tables import Human, table
from backfill_assets.ingest.importer import ImportInputError, export_files, import_files
from backfill_assets.orchestration.orchestrate import ensure_tenant_partitions, record_import
from backfill_assets.orchestration.resources import engine_for
from backfill_assets.orchestration.settings import Settings
from backfill_assets.store.engine import read_tx
from backfill_assets.store.posts import ImportSummary
from backfill_assets.store.rejects import list_rejects, reject_sources, rejected_tenant_values
from backfill_assets.store.reports import tenant_ids

IMPORT_COLUMNS = ["file", "read", "imported", "updated", "unchanged", "rejected"]
REJECT_COLUMNS = ["source", "line", "tenant", "reason", "at"]


def add_ingest_commands(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Register ``import`` and ``rejects``."""
    sp = add("import", "Stream JSONL exports (plain or .gz, a file or a directory) into posts.")
    sp.add_argument(
        "path",
        help="a JSONL file (tenant_id/tenantId, post_id/postId, text per line), gzip or not, "
        "or a directory: its *.jsonl and *.jsonl.gz files in name order",
    )
    sp.set_defaults(func=cmd_import)

    sp = add("rejects", "List rejected import lines: file, line, reason and when (never text).")
    sp.add_argument("--tenant", default=None, help="only lines that gave this tenant value")
    sp.add_argument("--file", default=None, help="only lines of this file (path or file name)")
    sp.add_argument("--limit", type=int, default=1000, help="rows listed (0: all)")
    sp.set_defaults(func=cmd_rejects)


def rejects_hint(n: int) -> str:
    """The one line that points at ``rejects`` after an import."""
    return f"{n} line{'' if n == 1 else 's'} rejected, see `backfill-moderation rejects`"


def cmd_import(args: argparse.Namespace, settings: Settings) -> int:
    """Import a file or directory and register new tenants as partitions."""
    try:
        files = export_files(Path(args.path))
    except ImportInputError as exc:
        raise UserError(str(exc)) from None
    engine = engine_for(settings.store_url)
    with ProgressDisplay("lines", enabled=wanted(args.json)) as display:

        def progress(path: Path, s: ImportSummary) -> None:
            display.update(path.name, s.read, imported=s.imported, rejected=s.rejected)

        try:
            target = settings.slice_target_posts
            done = import_files(engine, files, progress=progress, slice_target=target)
        except ImportInputError as exc:
            raise UserError(str(exc)) from None
        finally:
            # Also after a corrupt file: the posts committed before it need their partitions.
            with read_tx(engine) as conn:
                all_tenants = tenant_ids(conn)
            ensure_tenant_partitions(instance(settings), all_tenants)
    total = ImportSummary()
    for _, s in done:
        total.add(s)
    record_import(instance(settings), args.path, total)
    rows = [{"file": f.name, **_counts(s)} for f, s in done]
    if len(rows) > 1:
        rows.append({"file": f"total ({len(rows)} files)", **_counts(total)})
    human: list[Human] = [table(rows, IMPORT_COLUMNS)]
    if total.new_tenants:
        human.append(f"new tenants: {', '.join(sorted(total.new_tenants))}")
    emit(args, total.as_dict(), *human)
    if total.new_rejects and not args.json:
        # On stderr, and only for lines not recorded before: re-importing the same file
        # (as bin/dev does at every start) does not repeat it.
        print(rejects_hint(total.new_rejects), file=sys.stderr, flush=True)
    return 0


def _counts(s: ImportSummary) -> dict[str, Any]:
    return {k: v for k, v in s.as_dict().items() if k != "new_tenants"}


def cmd_rejects(args: argparse.Namespace, settings: Settings) -> int:
    """Rejected lines with their source, line number, reason and time; never their text."""
    engine = engine_for(settings.store_url)
    with read_tx(engine) as conn:
        sources = reject_sources(conn)
        if args.tenant is not None:
            tenant_values = sorted({*tenant_ids(conn), *rejected_tenant_values(conn)})
            known_value([args.tenant], tenant_values, "tenant", "--tenant")
        chosen = _sources_for(args.file, sources) if args.file is not None else []
        page = list_rejects(conn, args.tenant, chosen, limit=max(args.limit, 0))
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
    exact = {given, str(path.resolve())}
    chosen = [s for s in sources if s in exact or Path(s).name == given]
    if chosen or path.is_file():
        return chosen or [str(path.resolve())]
    names = sorted({Path(s).name for s in sources})
    known_value([path.name or given], names, "file", "--file")
    raise UserError(f"argument --file: {given}: no such file, and no rejected lines from it")
