import json

import pytest

from backfill_assets.domain.work.records import (
    MAX_TEXT_BYTES,
    Post,
    Rejection,
    merge_runs,
    parse_line,
)


def line(obj: object) -> bytes:
    return json.dumps(obj).encode()


def test_snake_and_camel_case_are_accepted() -> None:
    a = parse_line(line({"tenant_id": "acme", "post_id": "p1", "text": "hi"}), 1)
    b = parse_line(line({"tenantId": "acme", "postId": "p1", "text": "hi"}), 2)
    assert isinstance(a, Post) and isinstance(b, Post)
    assert (a.tenant_id, a.post_id, a.content_hash) == (b.tenant_id, b.post_id, b.content_hash)


def test_blank_line_is_skipped() -> None:
    assert parse_line(b"   ", 4) is None


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"tenant_id": "acme", "post_id": "p1", "text": ', "invalid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (line({"tenant_id": "acme", "text": "x"}), "missing field(s): post_id"),
        (line({"post_id": "p", "text": "x"}), "missing field(s): tenant_id"),
        (line({"tenant_id": "acme", "post_id": "p"}), "missing field(s): text"),
        (line({"tenant_id": "../evil", "post_id": "p", "text": "x"}), "tenant_id does not match"),
        (line({"tenant_id": 5, "post_id": "p", "text": "x"}), "tenant_id must be a string"),
        (line({"tenant_id": "acme", "post_id": 17, "text": "x"}), "post_id must be a string"),
        (line({"tenant_id": "acme", "post_id": "  ", "text": "x"}), "post_id is empty"),
        (line({"tenant_id": "acme", "post_id": "p" * 201, "text": "x"}), "post_id longer"),
        (line({"tenant_id": "acme", "post_id": "p", "text": None}), "text must be a string"),
        (
            line({"tenant_id": "acme", "post_id": "p", "text": "x" * (MAX_TEXT_BYTES + 1)}),
            "text larger",
        ),
        (
            line({"tenant_id": "acme", "tenantId": "other", "post_id": "p", "text": "x"}),
            "conflicting",
        ),
        (b"\xff\xfe not utf8", "not valid UTF-8"),
        (line({"tenant_id": "acme", "post_id": "p", "text": "nul\u0000byte"}), "NUL"),
        (line({"tenant_id": "acme", "post_id": "p", "text": "\ud800"}), "surrogates"),
        (line({"tenant_id": "acme", "post_id": "\ud800", "text": "x"}), "control characters"),
    ],
)
def test_bad_lines_are_rejected_with_a_reason_and_line_number(raw: bytes, reason: str) -> None:
    out = parse_line(raw, 42)
    assert isinstance(out, Rejection)
    assert out.line == 42
    assert reason in out.reason


def test_rejection_never_carries_the_text() -> None:
    secret = "SECRET-POST-TEXT-123"
    out = parse_line(line({"tenant_id": "../evil", "post_id": "p", "text": secret}), 1)
    assert isinstance(out, Rejection)
    assert secret not in out.reason
    assert out.tenant_given == "../evil"


def test_tenant_given_is_truncated_and_printable() -> None:
    out = parse_line(line({"tenant_id": "x\n" * 50, "post_id": "p", "text": "t"}), 1)
    assert isinstance(out, Rejection)
    assert (
        out.tenant_given is not None
        and len(out.tenant_given) <= 40
        and "\n" not in out.tenant_given
    )


def test_byte_order_mark_on_the_first_line_is_ignored() -> None:
    raw = "\ufeff".encode() + line({"tenant_id": "acme", "post_id": "p1", "text": "hi"})
    assert isinstance(parse_line(raw, 1), Post)
    assert isinstance(parse_line(raw, 2), Rejection)


def test_runs_of_the_same_refusal_become_one_and_nothing_else_moves() -> None:
    def no(line: int, reason: str = "empty", rows: int = 1) -> Rejection:
        return Rejection(line, reason, None, f"row {line}", rows=rows)

    items: list[str | Rejection] = [
        no(1),
        no(2),
        no(3, rows=4),
        "post 7",
        no(8),
        no(9, "other"),
        no(10, "other"),
        no(12, "other"),
    ]
    got = list(merge_runs(items))
    assert got == [
        Rejection(1, "empty", None, "rows 1-6", rows=6),
        "post 7",
        no(8),
        Rejection(9, "other", None, "rows 9-10", rows=2),
        no(12, "other"),
    ]
    assert sum(r.rows for r in got if isinstance(r, Rejection)) == 10
