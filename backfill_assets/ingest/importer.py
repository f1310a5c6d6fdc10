"""Stream JSONL exports (plain or gzip, a file or a directory of them) into the store."""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.engine import Engine

from backfill_assets.core.keys import DEFAULT_SLICE_TARGET
from backfill_assets.core.records import Post, Rejection, parse_line
from backfill_assets.store.engine import refresh_planner_stats
from backfill_assets.store.posts import ImportSummary, raise_slice_levels, write_batch

BATCH_LINES = 2000
EXPORT_PATTERNS = ("*.jsonl", "*.jsonl.gz")
_GZIP_MAGIC = b"\x1f\x8b"

Progress = Callable[[Path, ImportSummary], None]


class ImportInputError(ValueError):
    """A path that cannot be imported: missing, unreadable, empty directory, corrupt gzip."""


def export_files(path: Path) -> list[Path]:
    """The files an import of ``path`` reads, in order; each one checked to open."""
    if path.is_dir():
        files = sorted({f for pat in EXPORT_PATTERNS for f in path.glob(pat)}, key=lambda f: f.name)
        if not files:
            raise ImportInputError(f"{path}: directory has no *.jsonl or *.jsonl.gz files")
    elif path.exists():
        files = [path]
    elif path.is_symlink():
        raise ImportInputError(f"{path}: broken symbolic link")
    else:
        raise ImportInputError(f"{path}: no such file or directory")
    for f in files:
        # Checked before anything is imported, so a bad file in a directory stops the whole
        # import rather than leaving it half done.
        try:
            with f.open("rb"):
                pass
        except OSError as exc:
            raise ImportInputError(f"{f}: cannot read: {exc.strerror or exc}") from None
    return files


def files_within(path: str, root: Path) -> list[Path]:
    """The exports ``path`` names, each one inside ``root`` once symbolic links are resolved.

    ``path`` is relative to ``root`` (or absolute inside it). What the UI imports comes from
    here only: a launch naming ``../`` or a link out of the directory is refused, so run config
    cannot plant another file's lines into a tenant.
    """
    base = root.resolve()
    given = Path(path)
    target = given if given.is_absolute() else base / given
    files = export_files(target) if _inside(target, base) else []
    outside = [f for f in files if not _inside(f, base)] if files else [target]
    if outside:
        raise ImportInputError(
            f"{path}: outside the import directory {base} (BACKFILL_IMPORT_DIR); "
            "imports launched from Dagster read only from there"
        )
    return files


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root)


@contextmanager
def _open_lines(path: Path) -> Iterator[io.BufferedIOBase]:
    """The file's bytes, decompressed when it is gzip (by its magic bytes, not its name)."""
    with path.open("rb") as raw:
        magic = raw.read(2)
        raw.seek(0)
        if magic == _GZIP_MAGIC:
            with gzip.GzipFile(fileobj=raw, mode="rb") as gz:
                yield gz
        else:
            yield raw


def import_jsonl(
    engine: Engine,
    path: Path,
    source: str | None = None,
    progress: Progress | None = None,
    slice_target: int = DEFAULT_SLICE_TARGET,
) -> ImportSummary:
    """Import a file or every export in a directory; bad lines go to ``rejected_records``.

    ``slice_target``: posts per partition before a tenant's partitions split.
    """
    files = export_files(path)
    if len(files) == 1 and files[0] == path:
        return _import_file(engine, path, source or str(path.resolve()), progress, slice_target)
    total = ImportSummary()
    for f in files:
        total.add(_import_file(engine, f, str(f.resolve()), progress, slice_target))
    return total


def import_files(
    engine: Engine,
    files: list[Path],
    progress: Progress | None = None,
    slice_target: int = DEFAULT_SLICE_TARGET,
) -> list[tuple[Path, ImportSummary]]:
    """Import files from ``export_files`` one after another; the summary of each."""
    return [(f, _import_file(engine, f, str(f.resolve()), progress, slice_target)) for f in files]


def _import_file(
    engine: Engine, path: Path, source: str, progress: Progress | None, slice_target: int
) -> ImportSummary:
    summary = ImportSummary()
    batch: list[Post | Rejection] = []
    line_no = 0
    try:
        with _open_lines(path) as fh:
            for line_no, raw in enumerate(fh, start=1):
                parsed = parse_line(raw.rstrip(b"\r\n"), line_no)
                if parsed is None:
                    continue
                summary.read += 1
                batch.append(parsed)
                if len(batch) >= BATCH_LINES:
                    write_batch(engine, source, batch, summary)
                    batch = []
                    if progress is not None:
                        progress(path, summary)
    except (OSError, EOFError, zlib.error) as exc:
        # A truncated or corrupt gzip: what came before it is imported, the rest is not.
        if batch:
            write_batch(engine, source, batch, summary)
        raise_slice_levels(engine, summary.tenants_seen, slice_target)
        raise ImportInputError(
            f"{path}: unreadable after line {line_no} ({type(exc).__name__}: {exc}); "
            "the lines before it were imported"
        ) from None
    if batch:
        write_batch(engine, source, batch, summary)
    raise_slice_levels(engine, summary.tenants_seen, slice_target)
    if progress is not None:
        progress(path, summary)
    refresh_planner_stats(engine, ("tenants", "posts"))
    return summary
