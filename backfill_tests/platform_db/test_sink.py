"""Labels back into the platform's table: ``applied_labels`` upserts them into
BACKFILL_SINK_TABLE of BACKFILL_SINK_URL (a database of its own: SQLite or a real PostgreSQL),
keyed and batched; replays change nothing, an older policy version never replaces a newer one,
and a sink that refuses a batch mid-apply loses nothing: the store keeps the labels, `verify`
names the gap, and the next run completes the write-back."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import main
from backfill_assets.platform_db.sink import Sink, ddl, sink_table
from backfill_assets.platform_db.sink_upsert import upsert, upsert_portable
from backfill_tests.conftest import import_records, pg_database

TENANTS = ["acme", "globex"]
POSTS = 40
PASSWORD = "sink-pw-7f3a9c"


@pytest.fixture(params=["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
def sink_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The platform's database, its own (never the store's), with the table created from
    `sink ddl` as an operator would."""
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / 'platform.db'}"
        else:
            if not request.getfixturevalue("pg_available"):
                pytest.skip("PostgreSQL not available")
            url = stack.enter_context(pg_database("bf_sink"))
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            conn.exec_driver_sql(ddl("moderation_labels", engine.dialect.name))
        engine.dispose()
        yield url


def with_password(url: str) -> str:
    """The URL as an operator would give it, with a password to keep out of messages (PG's
    trust auth here ignores it)."""
    if not url.startswith("postgresql"):
        return url
    return sa.engine.make_url(url).set(password=PASSWORD).render_as_string(hide_password=False)


def sink_rows(url: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(sink_table()))
            return {(r.tenant_id, r.post_id, r.policy_id): dict(r._mapping) for r in rows}
    finally:
        engine.dispose()


def store_rows(engine: Engine) -> dict[tuple[str, str, str], tuple[Any, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT a.tenant_id, a.post_id, a.policy_id, a.label, a.rule_ids, r.confidence,"
                " a.policy_version, a.key_version, a.model, a.content_hash"
                " FROM applied_labels a JOIN results r ON r.key = a.result_key"
            )
        ).all()
    return {(r[0], r[1], r[2]): tuple(r[3:]) for r in rows}


def as_store(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(
        row[c]
        for c in (
            "label",
            "rule_ids",
            "confidence",
            "policy_version",
            "key_version",
            "model",
            "content_hash",
        )
    )


def verify_json(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()  # what came before
    code = main(["verify", "--json", *flags])
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture
def posts(engine: Engine, tmp_path: Path, cli_store: dict[str, str]) -> Engine:
    records = [
        {"tenant_id": t, "post_id": f"p{i:03d}", "text": f"{t} post {i}: shipped today"}
        for t in TENANTS
        for i in range(POSTS)
    ]
    import_records(engine, tmp_path, records)
    return engine


def test_labels_are_written_back_once_and_a_replay_changes_nothing(
    posts: Engine,
    sink_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Labelled and applied before the sink existed: the next run writes them back.
    assert main(["run"]) == 0
    monkeypatch.setenv("BACKFILL_SINK_URL", with_password(sink_url))
    monkeypatch.setenv("BACKFILL_SINK_BATCH", "7")
    code, doc = verify_json(capsys)
    with posts.connect() as conn:
        used = conn.execute(
            sa.text("SELECT count(*) FROM (SELECT DISTINCT tenant_id, slice FROM posts) AS p")
        ).scalar_one()
    assert code == 0 and doc["sink"]["pending_partitions"] == used > 16
    assert main(["run"]) == 0
    assert "model_calls 0" in capsys.readouterr().out  # nothing re-paid, only written back
    expected = store_rows(posts)
    got = sink_rows(sink_url)
    assert len(expected) == len(got) == 2 * POSTS
    assert {k: as_store(v) for k, v in got.items()} == expected
    code, doc = verify_json(capsys, "--require-complete")
    assert code == 0 and doc["sink"]["pending_partitions"] == 0
    # A forced rerun applies and writes back again: not a row, not a timestamp changes.
    assert main(["run", "--force"]) == 0
    assert sink_rows(sink_url) == got
    assert PASSWORD not in capsys.readouterr().out


def test_a_sink_that_refuses_a_batch_loses_nothing_and_the_next_run_completes_it(
    posts: Engine,
    sink_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("BACKFILL_SINK_URL", with_password(sink_url))
    monkeypatch.setenv("BACKFILL_SINK_BATCH", "2")
    # The platform refuses one row (a real constraint, not a hook in our code): the batch
    # holding it fails after earlier batches committed.
    victim = ("acme", "p017")
    sink = sa.create_engine(sink_url)
    with sink.begin() as conn:
        if sink.dialect.name == "postgresql":
            conn.exec_driver_sql(
                "ALTER TABLE moderation_labels ADD CONSTRAINT refuse_one"
                f" CHECK (post_id <> '{victim[1]}' OR tenant_id <> '{victim[0]}')"
            )
        else:
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse_one BEFORE INSERT ON moderation_labels"
                f" WHEN NEW.post_id = '{victim[1]}' AND NEW.tenant_id = '{victim[0]}'"
                " BEGIN SELECT RAISE(ABORT, 'refused by the platform'); END"
            )
    assert main(["run"]) == 1
    out = capsys.readouterr()
    text = out.out + out.err
    assert "write-back failed" in text and "table moderation_labels" in text
    assert PASSWORD not in text
    # Nothing lost: every label is applied in the store; the sink holds some; verify names
    # the partitions still owed.
    assert len(store_rows(posts)) == 2 * POSTS
    partial = sink_rows(sink_url)
    assert (*victim, "default") not in partial
    code, doc = verify_json(capsys)
    assert code == 0 and doc["sink"]["pending_partitions"] > 0
    pending = [p for p in doc["problems"] if p["kind"] == "sink_pending"]
    assert pending and all("not yet written back" in p["detail"] for p in pending)
    assert PASSWORD not in json.dumps(doc)
    assert verify_json(capsys, "--require-complete")[0] == 1
    # The platform lifts the refusal; the next run (no --force) completes the write-back.
    with sink.begin() as conn:
        if sink.dialect.name == "postgresql":
            conn.exec_driver_sql("ALTER TABLE moderation_labels DROP CONSTRAINT refuse_one")
        else:
            conn.exec_driver_sql("DROP TRIGGER refuse_one")
    sink.dispose()
    assert main(["run"]) == 0
    capsys.readouterr()
    done = sink_rows(sink_url)
    assert {k: as_store(v) for k, v in done.items()} == store_rows(posts)
    # What was written before the outage was not written again.
    assert all(done[k]["written_at"] == v["written_at"] for k, v in partial.items())
    assert verify_json(capsys, "--require-complete")[1]["sink"]["pending_partitions"] == 0


@pytest.mark.parametrize("portable", [False, True])
def test_an_older_version_never_replaces_a_newer_one_in_the_sink(
    sink_url: str, portable: bool
) -> None:
    """A run of version 1 that read its labels before version 2 was applied, and writes
    after: the sink keeps version 2's labels; an identical replay changes nothing."""
    table = sink_table()
    engine = sa.create_engine(sink_url)

    def row(post: str, version: str, label: str) -> tuple[Any, ...]:
        values = {
            "tenant_id": "acme",
            "post_id": post,
            "policy_id": "default",
            "label": label,
            "rule_ids": "",
            "confidence": 0.9,
            "policy_version": version,
            "key_version": f"kv{version}",
            "model": "m",
            "content_hash": "h",
            "labelled_at": dt.datetime(2026, 1, 1),
            "written_at": dt.datetime(2026, 1, 2),
            "p_label": None,
            "stage": None,
            "source": "model",
        }
        return tuple(values[c.name] for c in table.columns)

    # A database without ON CONFLICT takes the read-then-write path.
    write = upsert_portable if portable else upsert
    with engine.begin() as conn:
        assert write(conn, table, [row("p1", "2", "spam"), row("p2", "2", "ok")], ["kv3"]) == 2
    with engine.begin() as conn:
        # Version 1 is older than 2: 2 is among its newer versions.
        changed = write(conn, table, [row("p1", "1", "ok"), row("p3", "1", "ok")], ["kv2"])
        assert changed == 1  # p3 is new; p1 stays version 2's
    with engine.begin() as conn:
        assert write(conn, table, [row("p1", "2", "spam"), row("p2", "2", "ok")], ["kv3"]) == 0
    got = {k[1]: (v["policy_version"], v["label"]) for k, v in sink_rows(sink_url).items()}
    assert got == {"p1": ("2", "spam"), "p2": ("2", "ok"), "p3": ("1", "ok")}
    engine.dispose()


def test_sink_check_names_what_is_wrong(
    cli_store: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"sqlite:///{tmp_path / 'platform.db'}"
    monkeypatch.setenv("BACKFILL_SINK_URL", url)
    assert main(["sink", "check"]) == 2
    assert "table moderation_labels does not exist" in capsys.readouterr().err
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE moderation_labels (tenant_id TEXT, post_id TEXT)")
    assert main(["sink", "check"]) == 2
    err = capsys.readouterr().err
    assert "column policy_id is missing" in err and "no primary key or unique constraint" in err
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE moderation_labels")
        conn.exec_driver_sql(ddl("moderation_labels", "sqlite"))
    assert main(["sink", "check"]) == 0
    assert "OK" in capsys.readouterr().out
    monkeypatch.delenv("BACKFILL_SINK_URL")
    assert main(["sink", "check"]) == 2
    assert "BACKFILL_SINK_URL is not set" in capsys.readouterr().err
    assert (
        Sink(url="postgresql://u:pw@h/db").name
        == "sink postgresql://u:***@h/db table moderation_labels"
    )


def test_sink_write_fills_the_gaps_without_a_run_and_all_refills_an_emptied_table(
    posts: Engine,
    sink_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run"]) == 0
    monkeypatch.setenv("BACKFILL_SINK_URL", with_password(sink_url))
    capsys.readouterr()
    assert main(["sink", "write", "--tenant", "acme", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"] == doc["changed"] == POSTS and doc["error"] is None
    assert {k[0] for k in sink_rows(sink_url)} == {"acme"}
    assert main(["sink", "write", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == POSTS  # globex only: acme is done
    assert verify_json(capsys, "--require-complete")[1]["sink"]["pending_partitions"] == 0
    # The platform empties its table: the store cannot know, so --all writes everything.
    engine = sa.create_engine(sink_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM moderation_labels")
    engine.dispose()
    assert main(["sink", "write", "--all", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["changed"] == 2 * POSTS
    assert {k: as_store(v) for k, v in sink_rows(sink_url).items()} == store_rows(posts)


def test_p_label_reaches_a_sink_with_the_column_and_a_table_made_before_it_still_works(
    posts: Engine, sink_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["run"]) == 0  # the fake model gives no probability: p_label is NULL
    with posts.begin() as conn:
        conn.execute(sa.text("UPDATE results SET p_label = 0.75 WHERE post_id < 'p010'"))
    monkeypatch.setenv("BACKFILL_SINK_URL", with_password(sink_url))
    assert main(["run"]) == 0
    rows = sink_rows(sink_url)
    assert len(rows) == len(TENANTS) * POSTS
    assert {k[1]: r["p_label"] for k, r in rows.items() if k[1] < "p010"} == {
        f"p{i:03d}": 0.75 for i in range(10)
    }
    assert all(r["p_label"] is None for k, r in rows.items() if k[1] >= "p010")
    # One model's labels have no cascade stage: NULL in the stage column.
    assert {r["stage"] for r in rows.values()} == {None}
    # An operator's table from before p_label: checked fine, written without it.
    old = f"sqlite:///{tmp_path / 'old-platform.db'}"
    legacy = sa.create_engine(old)
    with legacy.begin() as conn:
        table = sink_table("moderation_labels", ())
        conn.exec_driver_sql(str(sa.schema.CreateTable(table).compile(legacy)))
    monkeypatch.setenv("BACKFILL_SINK_URL", old)
    assert main(["sink", "check"]) == 0
    assert main(["run"]) == 0
    with legacy.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM moderation_labels")).scalar_one() == (
            len(TENANTS) * POSTS
        )
    legacy.dispose()
