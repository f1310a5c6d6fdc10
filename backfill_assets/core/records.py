"""Input records: one JSONL line of an export becomes a validated post or a rejection (pure)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from backfill_assets.core.keys import TENANT_ID_RE, content_hash, normalize_text, slice_of
from backfill_assets.core.regions import InvalidRegion, validate_region

MAX_POST_ID_CHARS = 200
MAX_TEXT_BYTES = 32_768
MAX_LINE_BYTES = 256 * 1024


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


def _tenant_given(obj: dict[str, Any]) -> str | None:
    raw = obj.get("tenant_id", obj.get("tenantId"))
    # Truncated, printable only: a hostile tenant value is evidence, not something to replay.
    return None if raw is None else "".join(c for c in str(raw)[:40] if c.isprintable())


def _pick(obj: dict[str, Any], snake: str, camel: str) -> tuple[bool, Any]:
    if snake in obj and camel in obj and obj[snake] != obj[camel]:
        raise ValueError(f"conflicting {snake} and {camel}")
    if snake in obj:
        return True, obj[snake]
    if camel in obj:
        return True, obj[camel]
    return False, None


def parse_line(raw: bytes, line_no: int) -> Post | Rejection | None:
    """Validate one JSONL line; ``None`` for a blank line."""
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
    except (json.JSONDecodeError, RecursionError) as exc:
        return Rejection(line_no, f"invalid JSON: {getattr(exc, 'msg', type(exc).__name__)}", None)
    if not isinstance(obj, dict):
        return Rejection(line_no, f"expected a JSON object, got {type(obj).__name__}", None)
    try:
        return _validate(obj, line_no)
    except ValueError as exc:
        return Rejection(line_no, str(exc), _tenant_given(obj))


def _region(obj: dict[str, Any]) -> str | None:
    raw = obj.get("region")
    if raw is None:  # absent or null: the line does not set a region
        return None
    try:
        return validate_region(raw)
    except InvalidRegion as exc:
        raise ValueError(str(exc)) from None


def _validate(obj: dict[str, Any], line_no: int = 0) -> Post:
    has_tenant, tenant = _pick(obj, "tenant_id", "tenantId")
    has_post, post_id = _pick(obj, "post_id", "postId")
    has_text, text = "text" in obj, obj.get("text")
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
    region = _region(obj)
    return Post(
        tenant_id=tenant,
        post_id=post_id,
        text=text,
        content_hash=content_hash(text),
        slice=slice_of(tenant, post_id),
        region=region,
        line=line_no,
    )
