"""Input records: one row of an export (a JSONL line, a CSV record, a Parquet or query row)
becomes a ``Record`` of named values, then a validated post or a rejection (pure)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from backfill_assets.domain.work.columns import DEFAULT_COLUMNS, ColumnMap
from backfill_assets.domain.work.keys import TENANT_ID_RE, content_hash, normalize_text, slice_of
from backfill_assets.domain.work.regions import InvalidRegion, validate_region

MAX_POST_ID_CHARS = 200
MAX_TEXT_BYTES = 32_768
MAX_LINE_BYTES = 256 * 1024

_Item = TypeVar("_Item")


@dataclass
class RowCounts:
    """The rows an import read and what became of each: the counts ``import``, ``decisions
    import`` and ``baseline import`` print first, in this order."""

    read: int = 0
    imported: int = 0
    updated: int = 0
    unchanged: int = 0
    rejected: int = 0

    def add_counts(self, other: RowCounts) -> None:
        """Add another file's counts (a directory import)."""
        for name in _COUNTED:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def counts(self) -> dict[str, int]:
        """The counts, as ``--json`` prints them."""
        return {name: getattr(self, name) for name in _COUNTED}


_COUNTED = ("read", "imported", "updated", "unchanged", "rejected")


@dataclass(frozen=True, slots=True)
class Post:
    """A validated post, text NFC-normalised."""

    tenant_id: str
    post_id: str
    text: str
    content_hash: str
    slice: int
    # The tenant's region if the line gives one (``None``: the line says nothing about it).
    region: str | None = None
    # Where the line was, so a later check (a conflicting region) can reject it by number.
    line: int = 0


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a line was refused. Never carries the post text."""

    line: int
    reason: str
    tenant_given: str | None
    # Where the row is when a line number alone does not say (a Parquet row, a query's post).
    locator: str | None = None
    # Consecutive rows refused for the same reason, from ``line`` on (``merge_runs``).
    rows: int = 1


def merge_runs(items: Iterable[_Item | Rejection]) -> Iterator[_Item | Rejection]:
    """``items`` with each run of consecutive rejections of the same reason made one.

    For Parquet, where a row with no values costs no bytes: a few KB can claim billions of
    rows, and one refusal a row would write billions of rejects. A run is recorded once, at
    its first row, with its length."""
    run: Rejection | None = None
    for item in items:
        if (
            isinstance(item, Rejection)
            and run is not None
            and item.line == run.line + run.rows
            and (item.reason, item.tenant_given) == (run.reason, run.tenant_given)
        ):
            run = replace(run, rows=run.rows + item.rows)
            continue
        if run is not None:
            yield _located(run)
            run = None
        if isinstance(item, Rejection):
            run = item
        else:
            yield item
    if run is not None:
        yield _located(run)


def rows_locator(first: int, rows: int) -> str:
    """Where ``rows`` consecutive rows from ``first`` on are: ``row 7`` or ``rows 7-12``."""
    return f"row {first}" if rows == 1 else f"rows {first}-{first + rows - 1}"


def _located(run: Rejection) -> Rejection:
    if run.rows == 1:
        return run
    return replace(run, locator=rows_locator(run.line, run.rows))


@dataclass(frozen=True, slots=True)
class Record:
    """One row of named values as its format gives it (a JSON object, a CSV record, a Parquet
    row), before any field is validated."""

    line: int
    values: Mapping[str, Any]
    locator: str | None = None
    # Why the row cannot be read as named values (a CSV record with another number of cells
    # than its header); ``values`` then holds what could be named.
    problem: str | None = None


def shown(raw: object, limit: int = 40) -> str:
    """Truncated, printable only: a hostile value is evidence, not something to replay."""
    return "".join(c for c in str(raw)[:limit] if c.isprintable())


def _tenant_given(obj: Mapping[str, Any], columns: ColumnMap) -> str | None:
    try:
        _, raw = columns.pick(obj, "tenant_id")
    except ValueError:
        raw = next((obj[c] for c in columns.names("tenant_id") if c in obj), None)
    return None if raw is None else shown(raw)


def parse_line(
    raw: bytes,
    line_no: int,
    columns: ColumnMap = DEFAULT_COLUMNS,
    tenant: str | None = None,
) -> Post | Rejection | None:
    """Validate one JSONL line; ``None`` for a blank line.

    ``tenant``: the tenant the import is bound to (``import --tenant``), see ``validate_row``.
    """
    record = parse_object(raw, line_no)
    if record is None or isinstance(record, Rejection):
        return record
    return validate_record(record, columns, tenant)


def parse_object(raw: bytes, line_no: int) -> Record | Rejection | None:
    """One JSONL line as a record of named values; ``None`` for a blank line."""
    if len(raw) > MAX_LINE_BYTES:
        return Rejection(line_no, f"line longer than {MAX_LINE_BYTES} bytes", None)
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Rejection(line_no, "line is not valid UTF-8", None)
    if line_no == 1 and decoded.startswith("\ufeff"):
        decoded = decoded[1:]  # a byte-order mark some exporters write
    if not decoded.strip():
        return None
    try:
        obj = json.loads(decoded)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        return Rejection(line_no, f"invalid JSON: {json_error(exc)}", None)
    if not isinstance(obj, dict):
        return Rejection(line_no, f"expected a JSON object, got {type(obj).__name__}", None)
    return Record(line_no, obj)


def validate_record(
    record: Record,
    columns: ColumnMap = DEFAULT_COLUMNS,
    tenant: str | None = None,
    blank_is_null: bool = False,
) -> Post | Rejection:
    """A record of an export as a post (``validate_row``), or why it cannot be one."""
    if record.problem is not None:
        given = _tenant_given(record.values, columns)
        return Rejection(record.line, record.problem, given, record.locator)
    return validate_row(record.values, record.line, columns, tenant, record.locator, blank_is_null)


def json_error(exc: Exception) -> str:
    """Why ``json.loads`` refused a line, in words (never the line)."""
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    # int() of a number past Python's digit limit (sys.get_int_max_str_digits, 4,300).
    return "a number too long to read"


def validate_row(
    row: Mapping[str, Any],
    line_no: int,
    columns: ColumnMap = DEFAULT_COLUMNS,
    tenant: str | None = None,
    locator: str | None = None,
    blank_is_null: bool = False,
) -> Post | Rejection:
    """Validate one row of named values.

    ``tenant``: an import bound to one tenant rejects a row that names another, and gives
    its tenant to a row that names none. ``blank_is_null``: a format without nulls (CSV)
    leaves an optional field blank to say nothing about it.
    """
    try:
        return _validate(row, line_no, columns, tenant, blank_is_null)
    except ValueError as exc:
        given = _tenant_given(row, columns)
        return Rejection(line_no, str(exc), given or tenant, locator)


def _region(row: Mapping[str, Any], columns: ColumnMap, blank_is_null: bool) -> str | None:
    _, raw = columns.pick(row, "region")
    if raw is None or (blank_is_null and raw == ""):
        # absent or null: the row does not set a region
        return None
    try:
        return validate_region(raw)
    except InvalidRegion as exc:
        raise ValueError(str(exc)) from None


def _bound(has_tenant: bool, tenant: Any, bound: str | None) -> tuple[bool, Any]:
    """The row's tenant under an import bound to ``bound`` (``None``: not bound)."""
    if bound is None:
        return has_tenant, tenant
    if not has_tenant or tenant is None or tenant == "":
        return True, bound
    if tenant != bound:
        raise ValueError(
            f"tenant_id {shown(tenant)!r} is not {bound}, the tenant this import is bound to"
        )
    return True, tenant


def _validate(
    obj: Mapping[str, Any],
    line_no: int,
    columns: ColumnMap,
    bound: str | None,
    blank_is_null: bool,
) -> Post:
    has_tenant, tenant = _bound(*columns.pick(obj, "tenant_id"), bound)
    has_post, post_id = columns.pick(obj, "post_id")
    has_text, text = columns.pick(obj, "text")
    missing = [n for n, ok in (("tenant_id", has_tenant), ("post_id", has_post)) if not ok]
    if not has_text:
        missing.append("text")
    if missing:
        raise ValueError(f"missing field(s): {', '.join(missing)}")
    if not isinstance(tenant, str):
        raise ValueError(f"tenant_id must be a string, got {type(tenant).__name__}")
    if not TENANT_ID_RE.fullmatch(tenant):
        raise ValueError("tenant_id does not match ^[a-z0-9][a-z0-9-]{0,39}$")
    if not isinstance(post_id, str):
        raise ValueError(f"post_id must be a string, got {type(post_id).__name__}")
    if not post_id.strip():
        raise ValueError("post_id is empty")
    if len(post_id) > MAX_POST_ID_CHARS:
        raise ValueError(f"post_id longer than {MAX_POST_ID_CHARS} characters")
    if not post_id.isprintable():
        raise ValueError("post_id contains control characters")
    if not isinstance(text, str):
        raise ValueError(f"text must be a string, got {type(text).__name__}")
    text = normalize_text(text)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
        raise ValueError(f"text larger than {MAX_TEXT_BYTES} bytes")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text contains unpaired surrogates") from None
    if "\x00" in text:
        # PostgreSQL cannot store NUL in text; refusing it here keeps both stores equal.
        raise ValueError("text contains NUL characters")
    region = _region(obj, columns, blank_is_null)
    return Post(
        tenant_id=tenant,
        post_id=post_id,
        text=text,
        content_hash=content_hash(text),
        slice=slice_of(tenant, post_id),
        region=region,
        line=line_no,
    )
