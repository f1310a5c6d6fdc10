"""``import`` of directories and gzip files, bad paths, and ``rejects`` (never the text)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import main

SECRET = "SECRET-POST-TEXT-4242"


@pytest.fixture
def cli_env(cli_store: dict[str, str]) -> None:
    """``main`` on this test's store."""


def lines(*records: Any) -> bytes:
    return b"".join((r if isinstance(r, str) else json.dumps(r)).encode() + b"\n" for r in records)


def post(tenant: str, post_id: str, text: str) -> dict[str, str]:
    return {"tenant_id": tenant, "post_id": post_id, "text": text}


BAD_TENANT = post("Not A Tenant", "p9", SECRET)


def imported(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert main(["import", *argv, "--json"]) == 0, capsys.readouterr().err
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def texts(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT post_id, text FROM posts ORDER BY post_id"))
        return {r.post_id: r.text for r in rows}


def rejects(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    assert main(["rejects", *argv, "--json"]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out
    found: list[dict[str, Any]] = json.loads(out)["rejects"]
    return found


def test_a_gzip_export_is_streamed_with_its_line_numbers(
    engine: Engine, cli_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = tmp_path / "posts.jsonl.gz"
    body = lines(post("acme", "p1", "one"), "", BAD_TENANT, post("acme", "p2", "two"), "{oops")
    export.write_bytes(gzip.compress(body))
    doc = imported(capsys, [str(export)])
    assert doc == {
        "read": 4,
        "imported": 2,
        "updated": 0,
        "unchanged": 0,
        "rejected": 2,
        "new_tenants": ["acme"],
    }
    assert texts(engine) == {"p1": "one", "p2": "two"}
    found = rejects(capsys)
    assert [(r["source"], r["line"]) for r in found] == [
        (str(export.resolve()), 3),
        (str(export.resolve()), 5),
    ]
    assert found[0]["tenant"] == "Not A Tenant" and "tenant_id does not match" in found[0]["reason"]
    assert found[1]["reason"].startswith("invalid JSON")


def test_a_directory_imports_its_exports_in_name_order(
    engine: Engine, cli_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "exports"
    (d / "nested").mkdir(parents=True)
    # b edits p1 after a wrote it: name order, so b's text wins; c is not an export.
    (d / "a.jsonl").write_bytes(lines(post("acme", "p1", "first"), post("acme", "p2", "x")))
    (d / "b.jsonl.gz").write_bytes(gzip.compress(lines(BAD_TENANT, post("acme", "p1", "second"))))
    (d / "c.txt").write_bytes(lines(post("acme", "p3", "not an export")))
    (d / "nested" / "d.jsonl").write_bytes(lines(post("acme", "p4", "not at the top")))
    doc = imported(capsys, [str(d)])
    assert (doc["read"], doc["imported"], doc["updated"], doc["rejected"]) == (4, 2, 1, 1)
    assert texts(engine) == {"p1": "second", "p2": "x"}
    assert [(Path(r["source"]).name, r["line"]) for r in rejects(capsys)] == [("b.jsonl.gz", 1)]

    # Again, as a table with a row per file and a total: a sets p1 back, b sets it again.
    assert main(["import", str(d)]) == 0
    out = capsys.readouterr().out
    assert not out.lstrip().startswith("{")
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["file", "read", "imported", "updated", "unchanged", "rejected"]
    assert ["a.jsonl", "2", "0", "1", "1", "0"] in rows
    assert ["b.jsonl.gz", "2", "0", "1", "0", "1"] in rows
    assert ["total", "(2", "files)", "4", "0", "2", "1", "1"] in rows


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: None, "no such file or directory"),
        (lambda d: d.mkdir(), "directory has no export files"),
        (lambda d: (d.mkdir(), (d / "b.jsonl").mkdir()), "b.jsonl: cannot read: Is a directory"),
        (
            lambda d: (d.mkdir(), (d / "z.jsonl").symlink_to(d / "gone.jsonl")),
            "z.jsonl: cannot read: No such file or directory",
        ),
    ],
)
def test_paths_that_cannot_be_imported_exit_2_before_importing_anything(
    engine: Engine,
    cli_env: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make: Any,
    message: str,
) -> None:
    d = tmp_path / "exports"
    make(d)
    if d.is_dir():
        (d / "a.jsonl").write_bytes(lines(post("acme", "p1", "fine")))
        if len(os.listdir(d)) == 1:
            (d / "a.jsonl").unlink()  # the "empty directory" case
    assert main(["import", str(d)]) == 2
    err = capsys.readouterr().err
    assert "backfill-moderation import: error:" in err and message in err, err
    assert texts(engine) == {}


def test_a_truncated_gzip_exits_2_and_names_the_file(
    engine: Engine, cli_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = tmp_path / "cut.jsonl.gz"
    whole = gzip.compress(lines(*(post("acme", f"p{i}", f"t{i}") for i in range(5000))))
    export.write_bytes(whole[: len(whole) // 2])
    assert main(["import", str(export)]) == 2
    err = capsys.readouterr().err
    assert f"{export}: unreadable after line" in err and "EOFError" in err, err
    # What came before the cut is imported, and its tenant is a partition.
    assert 0 < len(texts(engine)) < 5000
    instance = dg.DagsterInstance.from_config(str(tmp_path / "home"))
    assert instance.get_dynamic_partitions("tenant_slices") == ["s00|acme"]
    instance.dispose()


def test_rejects_lists_file_line_reason_and_time_and_says_so_once(
    engine: Engine, cli_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = tmp_path / "posts.jsonl"
    export.write_bytes(lines(post("acme", "p1", "ok"), BAD_TENANT, post("globex", "p2", "ok")))
    assert main(["import", str(export)]) == 0
    err = capsys.readouterr().err
    assert err.count("1 line rejected, see `backfill-moderation rejects`") == 1
    # Importing the same file again records nothing new, so nothing is said again.
    assert main(["import", str(export)]) == 0
    assert "rejected" not in capsys.readouterr().err

    found = rejects(capsys)
    assert len(found) == 1
    assert set(found[0]) == {"source", "line", "locator", "tenant", "reason", "at"}
    assert found[0]["line"] == 2 and found[0]["at"].endswith("Z")
    assert rejects(capsys, "--file", "posts.jsonl") == found
    assert rejects(capsys, "--file", str(export)) == found
    assert rejects(capsys, "--tenant", "Not A Tenant") == found
    assert rejects(capsys, "--tenant", "globex") == []
    clean = tmp_path / "clean.jsonl"
    clean.write_bytes(lines(post("acme", "p5", "fine")))
    assert rejects(capsys, "--file", str(clean)) == []

    assert main(["rejects"]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out and str(export.resolve()) in out and "1 rejected line" in out


def test_a_second_export_over_many_tenants_updates_only_what_changed(
    engine: Engine, tmp_path: Path
) -> None:
    # A batch holds a few posts of each of many tenants; the stored hashes of all of them are
    # looked up together, in probes of 2,000 pairs on SQLite: batches of 2,500 lines cross a
    # probe's edge.
    from backfill_assets.ingest.importer import ImportOptions, import_path

    wide = ImportOptions(batch_rows=2_500)
    first = [post(f"t{t:02d}", f"p{i}", f"text {t} {i}") for i in range(70) for t in range(30)]
    (tmp_path / "one.jsonl").write_bytes(lines(*first))
    got = import_path(engine, tmp_path / "one.jsonl", options=wide)
    assert (got.imported, got.updated, got.unchanged) == (2_100, 0, 0)
    second = [
        post(r["tenant_id"], r["post_id"], r["text"] + (" edited" if n % 3 == 0 else ""))
        for n, r in enumerate(first)
    ] + [post(f"t{t:02d}", "p-new", "new") for t in range(10)]
    (tmp_path / "two.jsonl").write_bytes(lines(*second))
    got = import_path(engine, tmp_path / "two.jsonl", options=wide)
    assert (got.imported, got.updated, got.unchanged) == (10, 700, 1_400)
    with engine.connect() as conn:
        stored = {
            (r.tenant_id, r.post_id): r.text
            for r in conn.execute(sa.text("SELECT tenant_id, post_id, text FROM posts"))
        }
    assert stored == {(r["tenant_id"], r["post_id"]): r["text"] for r in second}
