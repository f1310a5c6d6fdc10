# ruff: noqa: F811
"""Posts straight from a database (PostgreSQL and SQLite sources, each in its own database):
the same posts and rejects as the JSONL, incremental imports from the mark's cursor value on
(a row committed later with that value is read, those read before count as unchanged), edited
rows as new work, and a URL that is never printed."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import main
from backfill_assets.domain.work.columns import ColumnMap
from backfill_assets.ingest.importer import ImportInputError, ImportOptions
from backfill_assets.ledger.dead_peer import DeadPeer
from backfill_assets.ledger.run.posts import ImportSummary
from backfill_assets.platform_db.connections import platform_engine
from backfill_assets.platform_db.sql_import import SqlImport, SqlSource, import_sql
from backfill_tests.cli_runs import clear_settings, cli_main
from backfill_tests.conftest import pg_database

# The import's module-scoped stores, one per module and backend (ingest/conftest.py): fixtures
# imported by name, which the tests' parameters then name again (F811).
from backfill_tests.ingest.conftest import engine, jsonl_truth, lite, module_store  # noqa: F401
from backfill_tests.ingest.exports import RECORDS, SECRET, counts, rejects, stored

T1 = dt.datetime(2026, 1, 1, 12, 0, 0)
T2 = T1 + dt.timedelta(minutes=1)
T3 = T1 + dt.timedelta(minutes=2)
MAPPED = "SELECT workspace, id, body, region, updated_at FROM app_posts"
MAP = ColumnMap.parse("tenant_id=workspace,post_id=id,text=body")


@pytest.fixture(scope="module", params=["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
def source_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The platform's database: a table of posts under its own column names."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('source') / 'app.db'}"
        return
    if not request.getfixturevalue("pg_available"):
        pytest.skip("PostgreSQL not available (set BACKFILL_TEST_PG_URL)")
    with pg_database("bf_source") as url:
        yield url


@pytest.fixture
def app(source_url: str) -> Iterator[sa.Engine]:
    """The source's engine, its table empty."""
    eng = sa.create_engine(source_url.replace("postgresql://", "postgresql+psycopg2://"))
    with eng.begin() as conn:
        conn.execute(sa.text("DROP TABLE IF EXISTS app_posts"))
        conn.execute(
            sa.text(
                "CREATE TABLE app_posts (seq INTEGER, workspace TEXT, id TEXT, body TEXT,"
                " region TEXT, updated_at TIMESTAMP)"
            )
        )
    yield eng
    eng.dispose()


def put(app: sa.Engine, *rows: tuple[Any, ...]) -> None:
    """Insert (workspace, id, body, updated_at) rows, numbered in order."""
    with app.begin() as conn:
        start = conn.execute(sa.text("SELECT count(*) FROM app_posts")).scalar_one()
        conn.execute(
            sa.text(
                "INSERT INTO app_posts (seq, workspace, id, body, updated_at)"
                " VALUES (:s, :w, :i, :b, :u)"
            ),
            [
                {"s": start + n, "w": w, "i": i, "b": b, "u": u}
                for n, (w, i, b, u) in enumerate(rows)
            ],
        )


def run(
    engine: Engine,
    url: str,
    cursor: str | None = "updated_at",
    batch: int = 3,
    query: str = MAPPED,
    **kw: Any,
) -> SqlImport:
    source = SqlSource(url=url, query=query, name="app", cursor=cursor)
    return import_sql(engine, source, options=ImportOptions(columns=MAP, batch_rows=batch), **kw)


def test_a_query_gives_the_jsonl_posts_keys_and_rejects(
    engine: Engine,
    app: sa.Engine,
    source_url: str,
    jsonl_truth: tuple[dict[str, object], list[Any], list[Any]],
) -> None:
    # PostgreSQL cannot hold a NUL in text, so its source has no such row (nor its reject).
    pg = source_url.startswith("postgresql")
    records = [r for r in RECORDS if not (pg and "\x00" in r["text"])]
    with app.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO app_posts (seq, workspace, id, body, region)"
                " VALUES (:s, :tenant_id, :post_id, :text, :region)"
            ),
            [{"s": n, **r} for n, r in enumerate(records)],
        )
    query = "SELECT workspace, id, body, region, seq FROM app_posts ORDER BY seq"
    source = SqlSource(url=source_url, query=query, name="all")
    got = import_sql(engine, source, slice_target=0, options=ImportOptions(columns=MAP))
    want_counts, want_posts, want_rejects = jsonl_truth
    if pg:
        dropped = len(RECORDS) - len(records)
        want_counts = {
            **want_counts,
            "read": int(str(want_counts["read"])) - dropped,
            "rejected": int(str(want_counts["rejected"])) - dropped,
        }
        want_rejects = [(r, t) for r, t in want_rejects if "NUL" not in r]
    assert counts(got.summary) == want_counts
    assert stored(engine) == want_posts
    assert [(reason, t) for _, reason, t in rejects(engine)] == want_rejects
    with engine.connect() as conn:
        locators = conn.execute(sa.text("SELECT locator FROM rejected_records")).scalars().all()
    assert all(SECRET not in str(x) for x in locators)
    assert "post_id 'p3'" in locators


def test_an_incremental_import_reads_each_row_once_per_change(
    engine: Engine, app: sa.Engine, source_url: str
) -> None:
    # Seven rows share T1, across two tenants with the same post ids; batches of three put
    # the mark in the middle of the tie.
    put(app, *[("acme", f"p{i}", f"a{i}", T1) for i in range(4)])
    put(app, *[("globex", f"p{i}", f"g{i}", T1) for i in range(3)])
    put(app, ("acme", "p8", "a8", T2), ("globex", "p9", "g9", T2))
    seen_fetch: list[str] = []

    class Stop(Exception):
        pass

    def stop_after_first_batch(_label: str, s: ImportSummary) -> None:
        if source_url.startswith("postgresql"):
            seen_fetch.append(_source_statement(app))
        raise Stop

    with pytest.raises(Stop):
        run(engine, source_url, progress=stop_after_first_batch)
    assert len(stored(engine)) == 3
    if source_url.startswith("postgresql"):
        # The rows come through a server-side cursor, a batch at a time.
        assert seen_fetch and seen_fetch[0].startswith("FETCH FORWARD ")

    # The rest reads T1 again from its first row: the three imported count as unchanged.
    rest = run(engine, source_url)
    assert (rest.summary.read, rest.summary.imported, rest.summary.unchanged) == (9, 6, 3)
    assert mark_of(rest) == (T2, "globex", "p9")
    nothing = run(engine, source_url)
    assert (nothing.summary.read, nothing.summary.imported, nothing.summary.unchanged) == (2, 0, 2)
    assert len(stored(engine)) == 9

    with app.begin() as conn:
        # Two edits, one row touched without a change, one new row, all at T3.
        conn.execute(
            sa.text(
                "UPDATE app_posts SET body = body || ' edited', updated_at = :t"
                " WHERE id IN ('p1', 'p2') AND workspace = 'acme'"
            ),
            {"t": T3},
        )
        conn.execute(
            sa.text(
                "UPDATE app_posts SET updated_at = :t WHERE id = 'p0' AND workspace = 'globex'"
            ),
            {"t": T3},
        )
    put(app, ("acme", "p10", "a10", T3))
    changed = run(engine, source_url)
    s = changed.summary
    # T2's two rows again, and T3's four: one new, two edits, one touched without a change.
    assert (s.read, s.imported, s.updated, s.unchanged, s.rejected) == (6, 1, 2, 3, 0)
    with app.connect() as conn:
        truth = {
            (r.workspace, r.id): r.body for r in conn.execute(sa.text("SELECT * FROM app_posts"))
        }
    assert {(t, p): text for t, p, _, _, text in stored(engine)} == truth


SUMMARY = ("read", "imported", "updated", "unchanged", "rejected")


@pytest.fixture
def import_json(
    engine: Engine,
    source_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Callable[[str], tuple[int, ...]]:
    """``import --sql ... --cursor COLUMN --json`` into the module's store: the summary's
    read, imported, updated, unchanged and rejected."""
    clear_settings(monkeypatch)
    monkeypatch.setenv("BACKFILL_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))

    def run_import(query: str, cursor: str = "updated_at") -> tuple[int, ...]:
        argv = ["import", "--sql", source_url, "--query", query, "--source", "app"]
        argv += ["--cursor", cursor, "--map", "tenant_id=workspace,post_id=id,text=body"]
        code, out, err = cli_main([*argv, "--json"], capsys)
        assert code == 0, err
        doc = json.loads(out.strip().splitlines()[-1])
        return tuple(int(doc[k]) for k in SUMMARY)

    return run_import


def test_rows_that_arrive_later_with_the_marks_timestamp_are_read(
    app: sa.Engine, import_json: Callable[[str], tuple[int, ...]]
) -> None:
    # The mark is (T1, globex, p4); ten rows committed afterwards at T1 sort before it.
    put(app, *[("globex", f"p{i}", f"g{i}", T1) for i in range(5)])
    assert import_json(MAPPED) == (5, 5, 0, 0, 0)
    put(app, *[("acme", f"q{i}", f"a{i}", T1) for i in range(10)])
    # The mark's whole cursor value is read again: the late rows are new, the rest unchanged.
    assert import_json(MAPPED) == (15, 10, 0, 5, 0)
    assert import_json(MAPPED) == (15, 0, 0, 15, 0)
    put(app, ("acme", "q10", "a10", T2))
    assert import_json(MAPPED) == (16, 1, 0, 15, 0)
    assert import_json(MAPPED) == (1, 0, 0, 1, 0)  # the mark moved on to T2


def test_rows_added_later_on_the_marks_day_are_read(
    app: sa.Engine, import_json: Callable[[str], tuple[int, ...]]
) -> None:
    # A date cursor: every row added later on the mark's day whose (tenant, post) sorts before
    # the mark's used to be lost.
    with app.begin() as conn:
        conn.execute(sa.text("DROP TABLE IF EXISTS app_days"))
        conn.execute(
            sa.text("CREATE TABLE app_days (workspace TEXT, id TEXT, body TEXT, day DATE)")
        )
    day = dt.date(2026, 1, 1)

    def add(*rows: tuple[str, str]) -> None:
        with app.begin() as conn:
            conn.execute(
                sa.text("INSERT INTO app_days VALUES (:w, :i, :b, :d)"),
                [{"w": w, "i": i, "b": f"{w} {i}", "d": day} for w, i in rows],
            )

    query = "SELECT workspace, id, body, day FROM app_days"
    add(("acme", "p1"), *[("globex", f"p{i}") for i in (1, 2, 3)])
    assert import_json(query, "day") == (4, 4, 0, 0, 0)
    add(("globex", "p0"), *[("acme", f"r{i}") for i in range(7)])
    assert import_json(query, "day") == (12, 8, 0, 4, 0)


def mark_of(done: SqlImport) -> tuple[dt.datetime, str | None, str | None]:
    """The import's mark (a SQLite source gives its timestamps as text)."""
    mark = done.high_water() or {}
    return dt.datetime.fromisoformat(str(mark["updated_at"])), mark["tenant_id"], mark["post_id"]


def _source_statement(app: sa.Engine) -> str:
    """What the import's session on the source last ran (seen from another session)."""
    with app.connect() as conn:
        return str(
            conn.execute(
                sa.text(
                    "SELECT query FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND query LIKE 'FETCH%'"
                )
            ).scalar_one_or_none()
            or ""
        )


def test_rows_without_a_cursor_value_are_rejected_every_time(
    engine: Engine, app: sa.Engine, source_url: str
) -> None:
    put(app, ("acme", "p1", "one", T1), ("acme", "p2", SECRET, None))
    first = run(engine, source_url, batch=10)
    assert (first.summary.imported, first.summary.rejected) == (1, 1)
    again = run(engine, source_url, batch=10)
    a = again.summary
    assert (a.read, a.imported, a.unchanged, a.rejected) == (2, 0, 1, 1)
    reasons = {reason for _, reason, _ in rejects(engine)}
    assert reasons == {
        "updated_at is NULL: an incremental import needs a cursor value on every row"
    }


def test_a_source_that_cannot_be_read_is_named_without_its_password(lite: Engine) -> None:
    url = "postgresql://app:hunter2pw@127.0.0.1:1/platform"
    with pytest.raises(ImportInputError) as caught:
        run(lite, url)
    message = str(caught.value)
    assert "hunter2pw" not in message and "app:***@127.0.0.1:1/platform" in message


def test_what_a_query_cannot_give_is_refused_before_anything(
    lite: Engine, app: sa.Engine, source_url: str
) -> None:
    put(app, ("acme", "p1", "one", T1))
    with pytest.raises(ImportInputError, match="column id gives int values, not text"):
        run(lite, source_url, query="SELECT workspace, seq AS id, body, updated_at FROM app_posts")
    with pytest.raises(ImportInputError, match="--cursor changed_at: the query has no such column"):
        run(lite, source_url, cursor="changed_at")
    with pytest.raises(ImportInputError, match="no column for text"):
        run(lite, source_url, query="SELECT workspace, id, updated_at FROM app_posts")
    assert stored(lite) == []
    run(lite, source_url)
    with pytest.raises(ImportInputError, match="was imported by updated_at, not by seq"):
        run(lite, source_url, cursor="seq", query=MAPPED.replace("updated_at", "updated_at, seq"))


def test_the_command_imports_a_query_and_prints_its_mark(
    lite: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("BACKFILL_DATABASE_URL", str(lite.url))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    source_url = f"sqlite:///{tmp_path / 'app.db'}"
    app = sa.create_engine(source_url)
    with app.begin() as conn:
        conn.execute(
            sa.text(
                "CREATE TABLE app_posts (seq INTEGER, workspace TEXT, id TEXT,"
                " body TEXT, region TEXT, updated_at TIMESTAMP)"
            )
        )
    put(app, ("acme", "p1", "one", T1), ("globex", "p2", SECRET, T2))
    argv = ["import", "--sql", source_url, "--query", MAPPED, "--source", "app"]
    argv += ["--cursor", "updated_at", "--map", "tenant_id=workspace,post_id=id,text=body"]
    assert main([*argv, "--tenant", "acme", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["imported"], doc["rejected"], doc["source"]) == (1, 1, "app")
    mark = doc["high_water"]
    assert dt.datetime.fromisoformat(mark["updated_at"]) == T2
    assert (mark["tenant_id"], mark["post_id"]) == ("globex", "p2")
    assert main(["rejects", "--json"]) == 0
    (reject,) = json.loads(capsys.readouterr().out)["rejects"]
    assert reject["source"] == "sql:app" and reject["line"] == 2
    assert reject["locator"].startswith("post_id 'p2', updated_at 2026-01-01")
    for bad, message in [
        (["--query", "SELECT 1"], "--query: only with --sql"),
        (["--sql", source_url, "--query", MAPPED], "--source: required with --sql"),
        (["x.csv", "--sql", source_url], "either a PATH or --sql"),
        (["--sql", source_url, "--query", MAPPED, "--source", "a", "--format", "csv"], "--format"),
        (["x.csv", "--map", "tenant=w"], "unknown field 'tenant'"),
        (["x.csv", "--tenant", "Not A Tenant"], "--tenant: invalid tenant id"),
    ]:
        assert main(["import", *bad]) == 2
        assert message in capsys.readouterr().err


def test_a_platform_connection_gives_up_on_a_vanished_host_in_seconds(source_url: str) -> None:
    # libpq's keepalives and tcp_user_timeout on every connection to a platform database (a
    # source, a sink), as on the store: a host that vanishes mid-read fails the import within
    # the dead-peer time.
    engine = platform_engine(source_url)
    if engine.dialect.name != "postgresql":
        pytest.skip("keepalives are a PostgreSQL connection's; a SQLite source is a local file")
    with engine.connect() as conn:
        params = conn.connection.dbapi_connection.get_dsn_parameters()  # type: ignore[union-attr]
    peer = DeadPeer()
    assert params["keepalives"] == "1"
    assert int(params["keepalives_idle"]) == peer.idle_s
    assert int(params["tcp_user_timeout"]) == peer.user_timeout_ms
