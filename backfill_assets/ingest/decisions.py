"""``decisions import``: moderators' decisions from exports (JSONL, CSV, Parquet; gzip; the
format decided by content) or a database query, read by the import's readers, each row's
fields checked here and the rest (policy version, labels, rules, the post) at the write
(``ledger/decisions/store.py``), in batches of one transaction each.

A row is a decision: ``tenant_id``, ``post_id``, ``policy_id``, ``policy_version``,
``label``, ``rule_ids`` (a list in JSONL and Parquet, ``;``-separated in CSV), an opaque
``reviewer_id`` (a value that looks like an email address is refused: no name or address
of a person is kept), ``decided_at`` (ISO 8601; a time without a zone is UTC) and an optional
``reason_code``. A refused row is recorded with its line and reason, never its values.
"""

from __future__ import annotations

import datetime as dt
import re
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.work.columns import ColumnMapError, parse_field_map
from backfill_assets.domain.work.keys import TENANT_ID_RE
from backfill_assets.domain.work.records import (
    MAX_POST_ID_CHARS,
    Record,
    Rejection,
    merge_runs,
    shown,
)
from backfill_assets.ingest.formats import Format, ImportInputError, sniff_format
from backfill_assets.ingest.importer import export_files
from backfill_assets.ingest.lines import InputBroken
from backfill_assets.ingest.readers import file_records
from backfill_assets.ledger.decisions.store import (
    BatchHook,
    Decision,
    DecisionsSummary,
    PolicyVersions,
    write_decisions,
)

FIELDS = (
    "tenant_id",
    "post_id",
    "policy_id",
    "policy_version",
    "label",
    "rule_ids",
    "reviewer_id",
    "decided_at",
    "reason_code",
)
_OPTIONAL = ("rule_ids", "reason_code")
# Columns a Parquet file may hold as a list of text or a timestamp.
_LOOSE = ("rule_ids", "decided_at")
BATCH_ROWS = 2000
_MAX_ID_CHARS = 200
# Something@something.tld: an address, which an opaque reviewer id never is.
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")

# (what is being imported, its counts so far)
Progress = Callable[[str, DecisionsSummary], None]


@dataclass(frozen=True)
class DecisionOptions:
    """How rows are read: ``--map``, ``--tenant``, ``--format``, the batch size."""

    columns: Mapping[str, str]
    tenant: str | None = None
    format: Format | None = None
    batch_rows: int = BATCH_ROWS


def parse_map(spec: str | None) -> dict[str, str]:
    """``--map policy_version=version,reviewer_id=moderator`` as field -> column."""
    try:
        return parse_field_map(spec, FIELDS)
    except ColumnMapError as exc:
        raise ImportInputError(f"argument --map: {exc}") from None


def column_of(columns: Mapping[str, str], name: str) -> str:
    return str(columns.get(name, name))


def wanted_columns(options: DecisionOptions) -> Callable[[list[str]], list[str]]:
    """What a header or schema must hold, and the columns to read."""

    def pick(names: list[str]) -> list[str]:
        needed = [
            f
            for f in FIELDS
            if f not in _OPTIONAL and not (f == "tenant_id" and options.tenant is not None)
        ]
        missing = [f for f in needed if column_of(options.columns, f) not in names]
        if missing:
            gone = ", ".join(f"{f} (from {column_of(options.columns, f)})" for f in missing)
            found = ", ".join(shown(n) for n in names[:20]) or "none"
            raise ImportInputError(
                f"no column for {gone}; its columns: {found} "
                "(--map FIELD=COLUMN reads a field from another column)"
            )
        wanted = {column_of(options.columns, f) for f in FIELDS}
        return [n for n in names if n in wanted]

    return pick


def _text(value: Any, name: str, most: int = _MAX_ID_CHARS) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and name != "post_id":
        value = str(value)  # a version or a reviewer number given as a JSON number
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {type(value).__name__}")
    # A post id is matched as the posts import kept it; the other fields are names.
    text: str = value if name == "post_id" else value.strip()
    if not text.strip():
        raise ValueError(f"{name} is empty")
    if len(text) > most:
        raise ValueError(f"{name} longer than {most} characters")
    if not text.isprintable():
        raise ValueError(f"{name} contains control characters")
    return text


def _rules(value: Any, fmt: Format | None) -> str:
    """Rule ids as stored: sorted, comma-joined, '' for none."""
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        items: Sequence[Any] = value.split(";")
    elif isinstance(value, list) and fmt != "csv":
        items = value
    else:
        raise ValueError("rule_ids must be a list of rule ids (';'-separated in CSV)")
    rules = {_text(r, "a rule id", 64) for r in items if not (isinstance(r, str) and not r.strip())}
    if any("," in r for r in rules):
        raise ValueError("a rule id contains ','")
    return ",".join(sorted(rules))


def decided_time(value: Any, now: dt.datetime | None = None) -> dt.datetime:
    """``decided_at`` as naive UTC: ISO 8601 text (a time without a zone is UTC) or a
    timestamp value (a Parquet or database column)."""
    if isinstance(value, str):
        text = value.strip()
        if len(text) < 11 or text[10] not in "Tt ":
            raise ValueError("decided_at must be an ISO 8601 date and time (2026-12-01T09:30Z)")
        try:
            when = dt.datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(
                "decided_at must be an ISO 8601 date and time (2026-12-01T09:30Z)"
            ) from None
    elif isinstance(value, dt.datetime):
        when = value
    else:
        raise ValueError(f"decided_at must be an ISO 8601 string, got {type(value).__name__}")
    if when.tzinfo is not None:
        when = when.astimezone(dt.UTC).replace(tzinfo=None)
    limit = (now or dt.datetime.now(dt.UTC).replace(tzinfo=None)) + dt.timedelta(days=1)
    if when > limit:
        raise ValueError("decided_at is in the future")
    return when


def to_decision(
    record: Record, options: DecisionOptions, fmt: Format | None
) -> Decision | Rejection:
    """A row of named values as a decision, or why it cannot be one (never its values)."""

    def given() -> str | None:
        raw = record.values.get(column_of(options.columns, "tenant_id"))
        return None if raw is None else shown(raw)

    if record.problem is not None:
        return Rejection(record.line, record.problem, given(), record.locator)
    try:
        return _decision(record, options, fmt)
    except ValueError as exc:
        return Rejection(record.line, str(exc), given() or options.tenant, record.locator)


def _decision(record: Record, options: DecisionOptions, fmt: Format | None) -> Decision:
    values, cols = record.values, options.columns

    def get(name: str) -> Any:
        value = values.get(column_of(cols, name))
        # CSV has no nulls: a blank optional cell says nothing.
        return None if fmt == "csv" and value == "" and name in _OPTIONAL else value

    missing = [
        f
        for f in FIELDS
        if f not in _OPTIONAL
        and get(f) is None
        and not (f == "tenant_id" and options.tenant is not None)
    ]
    if missing:
        raise ValueError(f"missing field(s): {', '.join(missing)}")
    tenant = get("tenant_id")
    if options.tenant is not None and tenant in (None, ""):
        tenant = options.tenant
    tenant = _text(tenant, "tenant_id", 40)
    if not TENANT_ID_RE.fullmatch(tenant):
        raise ValueError(f"tenant_id does not match {TENANT_ID_RE.pattern}")
    if options.tenant is not None and tenant != options.tenant:
        raise ValueError(
            f"tenant_id {tenant!r} is not {options.tenant}, the tenant this import is bound to"
        )
    reviewer = _text(get("reviewer_id"), "reviewer_id")
    if _EMAIL.search(reviewer):
        # Not echoed: it is a person's address, which the store never keeps.
        raise ValueError("reviewer_id looks like an email address; give an opaque reviewer id")
    reason = get("reason_code")
    return Decision(
        tenant_id=tenant,
        post_id=_text(get("post_id"), "post_id", MAX_POST_ID_CHARS),
        policy_id=_text(get("policy_id"), "policy_id", 64),
        policy_version=_text(get("policy_version"), "policy_version", 64),
        label=_text(get("label"), "label", 64),
        rule_ids=_rules(get("rule_ids"), fmt),
        reviewer_id=reviewer,
        decided_at=decided_time(get("decided_at")),
        reason_code=None if reason is None else _text(reason, "reason_code", 100),
        line=record.line,
        locator=record.locator,
    )


def import_decision_files(
    engine: Engine,
    path: Path,
    policy: Policy,
    options: DecisionOptions,
    progress: Progress | None = None,
) -> list[tuple[Path, DecisionsSummary]]:
    """Import a file or a directory's exports (``import``'s rules), one summary each."""
    versions = PolicyVersions(policy)
    return [(f, _import_file(engine, f, versions, options, progress)) for f in export_files(path)]


def _import_file(
    engine: Engine,
    path: Path,
    versions: PolicyVersions,
    options: DecisionOptions,
    progress: Progress | None,
) -> DecisionsSummary:
    fmt = options.format or sniff_format(path)
    summary = DecisionsSummary()
    source = str(path.resolve())
    try:
        with file_records(
            path, fmt, wanted_columns(options), options.batch_rows, _LOOSE
        ) as records:
            rows = (
                r if isinstance(r, Rejection) else to_decision(r, options, fmt) for r in records
            )
            merged = merge_runs(rows) if fmt == "parquet" else rows
            write_all(engine, merged, source, path.name, versions, options, summary, progress)
    except (OSError, EOFError, zlib.error) as exc:
        raise ImportInputError(
            f"{path}: unreadable ({type(exc).__name__}: {exc}); the rows before it were imported"
        ) from None
    except InputBroken as exc:
        raise ImportInputError(
            f"{path}: line {exc.line}: {exc.reason}; the rows before it were imported"
        ) from None
    return summary


def write_all(
    engine: Engine,
    rows: Iterator[Decision | Rejection],
    source: str,
    label: str,
    versions: PolicyVersions,
    options: DecisionOptions,
    summary: DecisionsSummary,
    progress: Progress | None,
    hook: BatchHook | None = None,
) -> None:
    """Write ``rows`` in batches of ``options.batch_rows``, one transaction each (``hook``
    runs inside it last). A break in the input: the rows before it are written, with the
    break's line as a rejection, then it is raised again."""
    batch: list[Decision | Rejection] = []
    try:
        for item in rows:
            summary.read += item.rows if isinstance(item, Rejection) else 1
            batch.append(item)
            if len(batch) >= options.batch_rows:
                write_decisions(engine, source, batch, versions, summary, hook)
                batch = []
                if progress is not None:
                    progress(label, summary)
    except InputBroken as exc:
        # What was read before the break is kept, with the break's line as a rejection.
        batch.append(Rejection(exc.line, exc.reason[:500], None))
        summary.read += 1
        write_decisions(engine, source, batch, versions, summary, hook)
        raise
    if batch:
        write_decisions(engine, source, batch, versions, summary, hook)
    if progress is not None:
        progress(label, summary)
