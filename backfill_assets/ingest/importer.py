"""Stream exports (JSONL, CSV or Parquet; a file or a directory of them) into the store.

Every format becomes the same stream of validated posts and rejections, written in batches of
``BATCH_LINES`` rows or ``BATCH_TEXT_CHARS`` of text: memory follows a batch, never the file.
What cannot be read on (a corrupt gzip, a broken CSV quote, a Parquet page that cannot be
decoded or is too large to) stops the file with an error that says
the rows before it were imported; a header or schema that lacks a needed column refuses the
file before anything is imported.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import Connection, Engine

from backfill_assets.domain.work.columns import DEFAULT_COLUMNS, ColumnMap
from backfill_assets.domain.work.keys import DEFAULT_SLICE_TARGET
from backfill_assets.domain.work.records import Post, Rejection, merge_runs, validate_record
from backfill_assets.ingest.formats import (
    EXPORT_PATTERNS,
    ColumnsFor,
    Format,
    ImportInputError,
    sniff_format,
)
from backfill_assets.ingest.lines import InputBroken
from backfill_assets.ingest.readers import file_records
from backfill_assets.ledger.engine import refresh_planner_stats
from backfill_assets.ledger.run.posts import ImportSummary, raise_slice_levels, write_batch

__all__ = [
    "ImportInputError",
    "ImportOptions",
    "export_files",
    "files_within",
    "import_files",
    "import_path",
]

BATCH_LINES = 2000
# The text a batch holds, together, in characters (a Python string may take 4 bytes each): a
# batch of long posts is written sooner, so memory follows bytes as well as rows.
BATCH_TEXT_CHARS = 4 * 1024 * 1024

# (what is being imported: a file name or a source, its counts so far)
Progress = Callable[[str, ImportSummary], None]
# Called inside each batch's transaction (an SQL source moves its high-water mark there).
BatchHook = Callable[[Connection, list[Post | Rejection]], None]


@dataclass(frozen=True)
class ImportOptions:
    """How rows are read: column names, the tenant an import is bound to, the format."""

    columns: ColumnMap = DEFAULT_COLUMNS
    # ``import --tenant``: rows naming another tenant are rejected.
    tenant: str | None = None
    # None: decided by each file's content.
    format: Format | None = None
    # Rows per batch (one transaction each); memory follows it.
    batch_rows: int = BATCH_LINES


DEFAULT_OPTIONS = ImportOptions()


def export_files(path: Path) -> list[Path]:
    """The files an import of ``path`` reads, in order; each one checked to open."""
    try:
        path.stat()
    except FileNotFoundError:
        pass  # said below, with a broken link told apart
    except OSError as exc:  # a name too long, a loop of links: no file to read
        raise _unusable(path, f"cannot read: {exc.strerror or exc}") from None
    if path.is_dir():
        files = sorted({f for pat in EXPORT_PATTERNS for f in path.glob(pat)}, key=lambda f: f.name)
        if not files:
            patterns = ", ".join(EXPORT_PATTERNS)
            raise _unusable(path, f"directory has no export files ({patterns})")
    elif path.exists():
        files = [path]
    elif path.is_symlink():
        raise _unusable(path, "broken symbolic link")
    else:
        raise _unusable(path, "no such file or directory")
    for f in files:
        # Checked before anything is imported, so a bad file in a directory stops the whole
        # import rather than leaving it half done.
        try:
            with f.open("rb"):
                pass
        except OSError as exc:
            raise _unusable(f, f"cannot read: {exc.strerror or exc}") from None
    return files


def _unusable(path: Path, reason: str) -> ImportInputError:
    return ImportInputError(f"{path}: {reason}", reason)


def files_within(path: str, root: Path) -> list[Path]:
    """The exports ``path`` names, each one inside ``root`` once symbolic links are resolved.

    ``path`` is relative to ``root`` (or absolute inside it). What the UI imports comes from
    here only: a launch naming ``../`` or a link out of the directory is refused, so run config
    cannot plant another file's lines into a tenant. A refusal names the reason, never the
    path: what a launch supplied is not echoed into the run's events and logs.
    """
    base = root.resolve()
    given = Path(path)
    target = given if given.is_absolute() else base / given
    where = f"the import directory {base} (BACKFILL_IMPORT_DIR)"
    try:
        files = export_files(target) if _inside(target, base) else []
    except ImportInputError as exc:
        raise ImportInputError(
            f"the import path (not repeated here) was refused inside {where}: {exc.reason}"
        ) from None
    if not files or any(not _inside(f, base) for f in files):
        raise ImportInputError(
            f"the import path (not repeated here) is outside {where}; "
            "imports launched from Dagster read only from there"
        )
    return files


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root)


def import_path(
    engine: Engine,
    path: Path,
    source: str | None = None,
    progress: Progress | None = None,
    slice_target: int = DEFAULT_SLICE_TARGET,
    options: ImportOptions = DEFAULT_OPTIONS,
) -> ImportSummary:
    """Import a file or every export in a directory; bad rows go to ``rejected_records``.

    ``slice_target``: posts per partition before a tenant's partitions split.
    """
    files = export_files(path)
    if len(files) == 1 and files[0] == path:
        where = source or str(path.resolve())
        return _import_file(engine, path, where, progress, slice_target, options)
    total = ImportSummary()
    for _, one in import_files(engine, files, progress, slice_target, options):
        total.add(one)
    return total


def import_files(
    engine: Engine,
    files: list[Path],
    progress: Progress | None = None,
    slice_target: int = DEFAULT_SLICE_TARGET,
    options: ImportOptions = DEFAULT_OPTIONS,
) -> list[tuple[Path, ImportSummary]]:
    """Import files from ``export_files`` one after another; the summary of each."""
    return [
        (f, _import_file(engine, f, str(f.resolve()), progress, slice_target, options))
        for f in files
    ]


def _post_columns(columns: ColumnMap, tenant: str | None) -> ColumnsFor:
    """What a header or schema must hold for posts, and the columns their fields are read from."""

    def pick(names: list[str]) -> list[str]:
        problem = columns.describe_missing(names, tenant is not None)
        if problem:
            raise ImportInputError(problem)
        return columns.source_columns(names)

    return pick


@contextmanager
def _file_rows(
    path: Path, fmt: Format, options: ImportOptions
) -> Iterator[Iterator[Post | Rejection]]:
    columns, tenant = options.columns, options.tenant
    wanted = _post_columns(columns, tenant)
    with file_records(path, fmt, wanted, options.batch_rows) as records:
        rows = (
            item
            if isinstance(item, Rejection)
            else validate_record(item, columns, tenant, blank_is_null=fmt == "csv")
            for item in records
        )
        # A Parquet row with no values costs no bytes: refusals come in runs, one a run.
        yield merge_runs(rows) if fmt == "parquet" else rows


def _import_file(
    engine: Engine,
    path: Path,
    source: str,
    progress: Progress | None,
    slice_target: int,
    options: ImportOptions,
) -> ImportSummary:
    fmt = options.format or sniff_format(path)
    summary = ImportSummary()
    try:
        with _file_rows(path, fmt, options) as rows:
            import_rows(engine, rows, source, summary, path.name, progress, options.batch_rows)
    except (OSError, EOFError, zlib.error) as exc:
        # A truncated or corrupt gzip: what came before it is imported, the rest is not.
        raise ImportInputError(
            f"{path}: unreadable after line {summary.last_line} ({type(exc).__name__}: {exc}); "
            "the lines before it were imported"
        ) from None
    except InputBroken as exc:
        raise ImportInputError(
            f"{path}: line {exc.line}: {exc.reason}; the rows before it were imported"
        ) from None
    finally:
        raise_slice_levels(engine, summary.tenants_seen, slice_target)
    refresh_planner_stats(engine, ("tenants", "posts"), force=bool(summary.new_tenants))
    return summary


def import_rows(
    engine: Engine,
    rows: Iterator[Post | Rejection],
    source: str,
    summary: ImportSummary,
    label: str,
    progress: Progress | None = None,
    batch_rows: int = BATCH_LINES,
    hook: BatchHook | None = None,
) -> None:
    """Write ``rows`` in batches. ``InputBroken`` from the reader: the batch so far is
    written with a rejection at the broken line, then it is raised again."""
    batch: list[Post | Rejection] = []
    held = 0
    try:
        for item in rows:
            summary.read += item.rows if isinstance(item, Rejection) else 1
            summary.last_line = item.line + (item.rows - 1 if isinstance(item, Rejection) else 0)
            batch.append(item)
            held += len(item.text) if isinstance(item, Post) else 0
            if len(batch) >= batch_rows or held >= BATCH_TEXT_CHARS:
                write_batch(engine, source, batch, summary, hook)
                batch, held = [], 0
                if progress is not None:
                    progress(label, summary)
    except InputBroken as exc:
        batch.append(Rejection(exc.line, exc.reason[:500], None))
        summary.read += 1
        write_batch(engine, source, batch, summary, hook)
        raise
    except (OSError, EOFError, zlib.error):
        # Unreadable bytes (a truncated gzip): what was read in full is kept.
        if batch:
            write_batch(engine, source, batch, summary, hook)
        raise
    if batch:
        write_batch(engine, source, batch, summary, hook)
    if progress is not None:
        progress(label, summary)
