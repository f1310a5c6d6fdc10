"""Gold sets for ``evaluate``: rows of ``id``, ``text``, ``label`` and an optional ``rule``, read
by the import's readers (JSONL, CSV, Parquet, gzip; the format decided by content) and held to
the rules posts follow (``records``). A bad row is rejected with its line number and reason,
never its text; the rest is evaluated. What stops an import (a quote that never closes, a
Parquet page too large to read) refuses the gold set: a measure of part of it would mislead."""

from __future__ import annotations

import datetime as dt
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import Engine

from backfill_assets.domain.policy.document import ITEM_ID_RE
from backfill_assets.domain.work.records import (
    Post,
    Record,
    Rejection,
    merge_runs,
    shown,
    validate_row,
)
from backfill_assets.ingest.formats import ImportInputError, sniff_format
from backfill_assets.ingest.lines import InputBroken
from backfill_assets.ingest.readers import file_records
from backfill_assets.ledger.decisions.gold import decided_posts, decided_sha256
from backfill_assets.ledger.engine import read_tx

# A gold set is held in memory: far above any set a person labels by hand.
MAX_GOLD_ROWS = 100_000
MAX_GOLD_TEXT_BYTES = 16 * 1024 * 1024
_COLUMNS = ("id", "text", "label", "rule")
_REQUIRED = ("id", "text", "label")


class GoldError(ValueError):
    """A gold file that cannot be read at all (missing, no rows, wrong columns, broken)."""


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

    @property
    def rejected_rows(self) -> int:
        """Rows refused; a run of empty Parquet rows is one rejection of many rows."""
        return sum(r.rows for r in self.rejected)


def _row(raw: Record, tenant: str, seen: set[str]) -> GoldRow | Rejection:
    line, values = raw.line, raw.values
    if raw.problem is not None:
        return Rejection(line, raw.problem, None)
    unknown = sorted(str(k) for k in values if k not in _COLUMNS)
    if unknown:
        return Rejection(line, f"unknown column(s): {', '.join(u[:40] for u in unknown[:5])}", None)
    label, rule = values.get("label"), values.get("rule")
    if not isinstance(label, str) or not ITEM_ID_RE.fullmatch(label):
        return Rejection(line, f"label must be a label id ({ITEM_ID_RE.pattern})", None)
    if rule in ("", None):
        rule = None
    elif not isinstance(rule, str) or not ITEM_ID_RE.fullmatch(rule):
        return Rejection(line, f"rule must be a rule id ({ITEM_ID_RE.pattern})", None)
    if "id" not in values:
        return Rejection(line, "missing field(s): id", None)
    record = {"tenant_id": tenant, "post_id": values["id"], "text": values.get("text")}
    if "text" not in values:
        del record["text"]
    post = validate_row(record, line)
    if isinstance(post, Rejection):
        return Rejection(line, post.reason.replace("post_id", "id"), None)
    if post.post_id in seen:
        return Rejection(line, "duplicate id (an earlier line has it)", None)
    seen.add(post.post_id)
    return GoldRow(post, label, rule)


def _gold_columns(names: list[str]) -> list[str]:
    """A gold set's header or schema: id, text and label, optionally rule, nothing else."""
    missing = [n for n in _REQUIRED if n not in names]
    if missing:
        shown_names = ", ".join(shown(n) for n in names[:20]) or "none"
        raise ImportInputError(
            f"a gold set's header needs id, text and label (rule optional); no {', '.join(missing)}"
            f" among its columns: {shown_names}"
        )
    unknown = [shown(n) for n in names if n not in _COLUMNS]
    if unknown:
        raise ImportInputError(f"unknown column(s) in a gold set: {', '.join(unknown[:5])}")
    return list(names)


def read_gold(path: str | Path, tenant: str) -> GoldSet:
    """Read a gold set as posts of ``tenant``."""
    p = Path(path)
    out = GoldSet()
    try:
        if p.is_dir():
            raise GoldError(f"{path}: a directory, not a gold set file")
        fmt = sniff_format(p)
        with file_records(p, fmt, _gold_columns) as records:
            # A run of empty Parquet rows is one refusal, as in an import.
            _collect(merge_runs(records) if fmt == "parquet" else records, p, tenant, out)
    except FileNotFoundError:
        raise GoldError(f"{path}: no such file or directory") from None
    except ImportInputError as exc:
        raise GoldError(str(exc)) from None
    except InputBroken as exc:
        raise GoldError(f"{path}: line {exc.line}: {exc.reason}; nothing was evaluated") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise GoldError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    if not out.rows:
        raise GoldError(f"{path}: no usable rows ({out.rejected_rows} rejected)")
    return out


def _collect(records: Iterator[Record | Rejection], path: Path, tenant: str, out: GoldSet) -> None:
    seen: set[str] = set()
    text_bytes = 0
    for entry in records:
        got = entry if isinstance(entry, Rejection) else _row(entry, tenant, seen)
        if isinstance(got, Rejection):
            out.rejected.append(got)
            # Held in memory like the rows: a Parquet file's empty rows cost it no bytes.
            if len(out.rejected) > MAX_GOLD_ROWS:
                raise GoldError(f"{path}: more than {MAX_GOLD_ROWS} rows rejected")
            continue
        out.rows.append(got)
        text_bytes += len(got.post.text.encode("utf-8"))
        if len(out.rows) > MAX_GOLD_ROWS:
            raise GoldError(f"{path}: more than {MAX_GOLD_ROWS} rows")
        if text_bytes > MAX_GOLD_TEXT_BYTES:
            raise GoldError(
                f"{path}: more than {MAX_GOLD_TEXT_BYTES} bytes of text by line {got.post.line} "
                "(a gold set is held in memory)"
            )


def read_decided_gold(
    engine: Engine,
    policy_id: str,
    gold_tenant: str,
    tenant: str | None = None,
    since: dt.datetime | None = None,
) -> tuple[GoldSet, str]:
    """Moderators' decisions as a gold set of ``gold_tenant`` (``evaluate --from-decisions``;
    ``ledger/decisions/gold.py``), with its digest: each decided post's current text, the
    label of its newest decision and that decision's first rule. A row the rules of posts
    refuse (an id too long once the tenant is in it) is rejected with its row number."""
    with read_tx(engine) as conn:
        found = decided_posts(conn, policy_id, tenant, since, MAX_GOLD_ROWS + 1)
    if len(found) > MAX_GOLD_ROWS:
        raise GoldError(f"more than {MAX_GOLD_ROWS} decided posts: narrow with --tenant or --since")
    out = GoldSet()
    for line, p in enumerate(found, 1):
        record = {"tenant_id": gold_tenant, "post_id": p.gold_id, "text": p.text}
        post = validate_row(record, line)
        if isinstance(post, Rejection):
            out.rejected.append(Rejection(line, post.reason.replace("post_id", "id"), None))
        else:
            out.rows.append(GoldRow(post, p.label, p.rule))
    if not out.rows:
        scope = f"tenant {tenant}" if tenant else "any tenant"
        when = f" since {since.isoformat()}" if since else ""
        raise GoldError(f"no decided posts of {scope} under policy {policy_id}{when}")
    return out, decided_sha256(found)
