"""Gold sets for ``evaluate``: CSV or JSONL rows of ``id``, ``text``, ``label`` and an
optional ``rule``, held to the rules posts follow (``records``). A bad row is rejected with its
line number and reason, never its text; the rest is evaluated."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backfill_assets.core.policy import ITEM_ID_RE
from backfill_assets.core.records import MAX_LINE_BYTES, Post, Rejection, json_error, validate_row

# A gold set is read into memory: far above any set a person labels by hand.
MAX_GOLD_ROWS = 100_000
MAX_GOLD_BYTES = 256 * 1024 * 1024


class GoldError(ValueError):
    """A gold file that cannot be read at all (missing, not UTF-8, no rows, wrong columns)."""


@dataclass(frozen=True, slots=True)
class GoldRow:
    """One labelled example: a post of the evaluation tenant and what its label should be."""

    post: Post
    label: str
    rule: str | None = None


@dataclass
class GoldSet:
    """The rows that passed, and the lines that did not (line, reason)."""

    rows: list[GoldRow] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)


def _row(raw: dict[str, Any], line: int, tenant: str, seen: set[str]) -> GoldRow | Rejection:
    unknown = sorted(str(k) for k in raw if k not in ("id", "text", "label", "rule"))
    if unknown:
        return Rejection(line, f"unknown column(s): {', '.join(u[:40] for u in unknown[:5])}", None)
    label, rule = raw.get("label"), raw.get("rule")
    if not isinstance(label, str) or not ITEM_ID_RE.fullmatch(label):
        return Rejection(line, f"label must be a label id ({ITEM_ID_RE.pattern})", None)
    if rule in ("", None):
        rule = None
    elif not isinstance(rule, str) or not ITEM_ID_RE.fullmatch(rule):
        return Rejection(line, f"rule must be a rule id ({ITEM_ID_RE.pattern})", None)
    if "id" not in raw:
        return Rejection(line, "missing field(s): id", None)
    record = {"tenant_id": tenant, "post_id": raw["id"], "text": raw.get("text")}
    if "text" not in raw:
        del record["text"]
    post = validate_row(record, line)
    if isinstance(post, Rejection):
        return Rejection(line, post.reason.replace("post_id", "id"), None)
    if post.post_id in seen:
        return Rejection(line, "duplicate id (an earlier line has it)", None)
    seen.add(post.post_id)
    return GoldRow(post, label, rule)


def _jsonl(text: str) -> list[tuple[int, Any]]:
    out: list[tuple[int, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if len(line.encode("utf-8")) > MAX_LINE_BYTES:
            out.append(
                (number, Rejection(number, f"line longer than {MAX_LINE_BYTES} bytes", None))
            )
            continue
        try:
            out.append((number, json.loads(line)))
        except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
            out.append((number, Rejection(number, f"invalid JSON: {json_error(exc)}", None)))
    return out


def _csv(text: str) -> list[tuple[int, Any]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if reader.fieldnames is None or not {"id", "text", "label"} <= set(reader.fieldnames):
        raise GoldError("a CSV gold set needs a header with id, text and label (rule optional)")
    out: list[tuple[int, Any]] = []
    try:
        for raw in reader:
            if None in raw:  # more cells than the header names
                out.append(
                    (reader.line_num, Rejection(reader.line_num, "more cells than columns", None))
                )
                continue
            out.append((reader.line_num, dict(raw)))
    except csv.Error as exc:
        raise GoldError(f"line {reader.line_num}: unreadable CSV ({exc})") from None
    return out


def read_gold(path: str | Path, tenant: str) -> GoldSet:
    """Read a gold set (``.csv``, else JSONL) as posts of ``tenant``."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise GoldError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_GOLD_BYTES:
        raise GoldError(f"{path}: larger than {MAX_GOLD_BYTES} bytes")
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise GoldError(f"{path}: line {line} is not valid UTF-8") from None
    entries = _csv(text) if p.suffix.lower() == ".csv" else _jsonl(text)
    out = GoldSet()
    seen: set[str] = set()
    for number, entry in entries:
        if isinstance(entry, Rejection):
            out.rejected.append(entry)
            continue
        if not isinstance(entry, dict):
            out.rejected.append(
                Rejection(number, f"expected an object, got {type(entry).__name__}", None)
            )
            continue
        got = _row(entry, number, tenant, seen)
        (out.rows if isinstance(got, GoldRow) else out.rejected).append(got)  # type: ignore[arg-type]
        if len(out.rows) > MAX_GOLD_ROWS:
            raise GoldError(f"{path}: more than {MAX_GOLD_ROWS} rows")
    if not out.rows:
        raise GoldError(f"{path}: no usable rows ({len(out.rejected)} rejected)")
    return out
