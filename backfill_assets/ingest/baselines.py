"""``baseline import``: a previous classifier's results per post, from a file (JSONL, CSV,
Parquet, gzip; the format decided by content) or a query's rows, read onto the policy's labels
(``domain/people/baseline_map.py``) and kept under a name (``ledger/decisions/baselines.py``).

A row names its post (``tenant_id``, ``post_id``; ``--tenant`` binds the import to one tenant)
and gives a ``label`` of the policy or attribute scores. A row that cannot be read, gives an
unknown label or a score outside [0, 1], names another tenant than the bound one, or names a
post the store does not hold is rejected with its line and reason (``rejects``), never its
text; the rest is imported. What stops the reading (a quote that never closes) stops the import
after the rows committed before it, as a posts import does.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from backfill_assets.domain.people.baseline_map import (
    FIELDS,
    PERSPECTIVE,
    BaselineRow,
    MappingError,
    MappingInvalid,
    ScoreMap,
    label_for,
    parse_columns,
    parse_threshold,
    read_mapping,
    row_scores,
    score_map,
    scores_json,
)
from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.work.records import (
    Post,
    Record,
    Rejection,
    RowCounts,
    merge_runs,
    rows_locator,
    shown,
    validate_row,
)
from backfill_assets.ingest.formats import Format, ImportInputError, sniff_format
from backfill_assets.ingest.lines import InputBroken
from backfill_assets.ingest.readers import BATCH_ROWS, file_records
from backfill_assets.ledger.decisions.baselines import upsert_baselines
from backfill_assets.ledger.engine import write_tx
from backfill_assets.ledger.run.rejects import record_rejects

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
# Rejections listed in a summary (all are recorded; ``rejects`` lists them).
LISTED_REJECTS = 100
NOT_IN_STORE = "no such post in the store (import the posts first)"
_NO_MAP = ScoreMap(())


@dataclass(frozen=True)
class BaselineImport:
    """What a baseline import reads and how: its name, the policy its labels belong to, the
    score bands (``None``: rows give labels), ``--map``'s columns and the bound tenant."""

    name: str
    policy: Policy
    score_map: ScoreMap | None = None
    columns: Mapping[str, str] = field(default_factory=dict)
    tenant: str | None = None

    def column(self, name: str) -> str:
        """The column a field is read from."""
        return self.columns.get(name, name)


@dataclass
class BaselineSummary(RowCounts):
    """Rows read, and what became of them; ``rejects``: the first ``LISTED_REJECTS``."""

    rejects: list[Rejection] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The counts, as ``--json`` prints them."""
        return dict(self.counts())


def baseline_options(
    name: str,
    policy: Policy,
    tenant: str | None,
    map_spec: str | None,
    thresholds: list[str],
    mapping: str | None,
) -> BaselineImport:
    """The import's options from the command line; ``ImportInputError`` naming the flag."""
    if not NAME_RE.fullmatch(name):
        raise ImportInputError(f"argument --name: {shown(name)!r} must match {NAME_RE.pattern}")
    flag = "--map"
    try:
        columns = parse_columns(map_spec)
        flag = "--mapping"
        bands = read_mapping(mapping) if mapping else []
        flag = "--threshold"
        bands += [parse_threshold(t) for t in thresholds]
        flag = "--threshold" if thresholds else "--mapping"
        smap = score_map(bands, policy)
    except (MappingError, MappingInvalid) as exc:
        raise ImportInputError(f"argument {flag}: {exc}") from None
    return BaselineImport(name, policy, smap, columns, tenant)


def columns_for(opts: BaselineImport) -> Callable[[list[str]], list[str]]:
    """A header's or a query's columns -> those to read; refuses one without a post column,
    a tenant column (unless bound) or a column to read a label or scores from."""

    def pick(names: list[str]) -> list[str]:
        need = ["post_id"] + ([] if opts.tenant else ["tenant_id"])
        missing = [f for f in need if opts.column(f) not in names]
        attributes = opts.score_map.attributes if opts.score_map else ()
        givers = [opts.column("label"), opts.column("scores"), PERSPECTIVE, *attributes]
        if not any(g in names for g in givers):
            missing.append("label, scores or a mapped attribute")
        if missing:
            seen = ", ".join(shown(n) for n in names[:20]) or "none"
            raise ImportInputError(
                f"a baseline needs a column for {'; '.join(missing)} (--map FIELD=COLUMN reads a "
                f"field from another column); its columns: {seen}"
            )
        wanted = [opts.column(f) for f in FIELDS] + [PERSPECTIVE, *attributes]
        return [n for n in names if n in wanted]

    return pick


def baseline_row(record: Record, opts: BaselineImport) -> BaselineRow | Rejection:
    """One record as a baseline row, or why it cannot be one."""
    values = record.values
    given = values.get(opts.column("tenant_id"))
    tenant_given = None if given is None else shown(given)
    if record.problem is not None:
        return Rejection(record.line, record.problem, tenant_given, record.locator)
    post = {"text": ""}
    for name in ("tenant_id", "post_id"):
        if opts.column(name) in values:
            post[name] = values[opts.column(name)]
    checked = validate_row(post, record.line, tenant=opts.tenant, locator=record.locator)
    if isinstance(checked, Rejection):
        return checked
    try:
        label, scores = _label(values, opts)
    except ValueError as exc:
        return Rejection(record.line, str(exc), checked.tenant_id, record.locator)
    return _row(record, checked, label, scores)


def _row(record: Record, post: Post, label: str, scores: str | None) -> BaselineRow:
    return BaselineRow(record.line, post.tenant_id, post.post_id, label, scores, record.locator)


def _label(values: Mapping[str, Any], opts: BaselineImport) -> tuple[str, str | None]:
    """The row's label and its scores as stored (``ValueError`` with the reason)."""
    policy, label = opts.policy, values.get(opts.column("label"))
    has_scores = any(
        values.get(c) not in (None, "")
        for c in (opts.column("scores"), PERSPECTIVE, *(opts.score_map or _NO_MAP).attributes)
    )
    if label not in (None, ""):
        if has_scores:
            raise ValueError("gives a label and scores: one or the other")
        if not isinstance(label, str) or label not in policy.label_ids:
            raise ValueError(
                f"label {shown(label)!r} is not a label of policy {policy.policy_id}@"
                f"{policy.version} ({', '.join(policy.label_ids)})"
            )
        return label, None
    if not has_scores:
        raise ValueError("gives neither a label nor scores")
    if opts.score_map is None:
        raise ValueError("gives scores: map them with --threshold or --mapping")
    scores = row_scores(values, opts.column("scores"), opts.score_map)
    return label_for(scores, opts.score_map, policy), scores_json(scores)


def import_baseline_file(
    engine: Engine, path: str | Path, fmt: Format | None, opts: BaselineImport
) -> BaselineSummary:
    """Import one file as baseline ``opts.name`` (``ImportInputError``: it cannot be read)."""
    p = Path(path)
    if p.is_dir():
        raise ImportInputError(f"{path}: a directory, not a baseline file")
    source = f"baseline {opts.name}: {p.resolve()}"
    try:
        chosen = fmt or sniff_format(p)
        attributes = opts.score_map.attributes if opts.score_map else ()
        with file_records(p, chosen, columns_for(opts), numbers=attributes) as records:
            rows = merge_runs(records) if chosen == "parquet" else records
            return _import(engine, rows, opts, source)
    except FileNotFoundError:
        raise ImportInputError(f"{path}: no such file or directory") from None
    except InputBroken as exc:
        raise ImportInputError(
            f"{path}: line {exc.line}: {exc.reason}; the rows before it were imported"
        ) from None
    except (OSError, EOFError, zlib.error) as exc:
        raise ImportInputError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None


def import_baseline_query(
    engine: Engine,
    names: list[str],
    open_rows: Callable[[list[str]], Iterable[list[tuple[Any, ...]]]],
    opts: BaselineImport,
    label: str,
) -> BaselineSummary:
    """Import a query's rows: ``names`` its columns, ``open_rows(columns)`` its rows in
    batches (the platform database's source); a row's line is its number in the result."""
    try:
        columns = columns_for(opts)(names)
    except ImportInputError as exc:
        raise ImportInputError(f"{label}: {exc}") from None

    def records() -> Iterator[Record]:
        line = 0
        for batch in open_rows(columns):
            for values in batch:
                line += 1
                yield Record(line, dict(zip(columns, values, strict=True)), rows_locator(line, 1))

    return _import(engine, records(), opts, f"baseline {opts.name}: {label}")


def _import(
    engine: Engine, entries: Iterable[Record | Rejection], opts: BaselineImport, source: str
) -> BaselineSummary:
    out = BaselineSummary()
    batch: list[BaselineRow | Rejection] = []
    for entry in entries:
        out.read += entry.rows if isinstance(entry, Rejection) else 1
        batch.append(entry if isinstance(entry, Rejection) else baseline_row(entry, opts))
        if len(batch) >= BATCH_ROWS:
            _flush(engine, batch, opts, source, out)
            batch = []
    _flush(engine, batch, opts, source, out)
    return out


def _flush(
    engine: Engine,
    batch: list[BaselineRow | Rejection],
    opts: BaselineImport,
    source: str,
    out: BaselineSummary,
) -> None:
    rows = [r for r in batch if isinstance(r, BaselineRow)]
    rejects = [r for r in batch if isinstance(r, Rejection)]
    with write_tx(engine) as conn:
        done = upsert_baselines(conn, opts.name, opts.policy.policy_id, rows)
        rejects += [Rejection(r.line, NOT_IN_STORE, r.tenant_id, r.locator) for r in done.missing]
        rejects.sort(key=lambda r: r.line)
        record_rejects(conn, source, rejects)
    out.imported += done.imported
    out.updated += done.updated
    out.unchanged += done.unchanged
    out.rejected += sum(r.rows for r in rejects)
    out.rejects += rejects[: max(0, LISTED_REJECTS - len(out.rejects))]
