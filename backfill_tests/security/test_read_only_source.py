"""A database source is only read: its query is one statement and cannot end the read-only
transaction it runs in, on PostgreSQL (the server opens it as one cursor) and SQLite (a
separator outside literals and comments is refused; the file is opened read-only). What a
payload smuggles in runs nowhere, and the refusal names the rule, never the query."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from backfill_tests.cli_runs import clear_settings, cli_main
from backfill_tests.conftest import pg_database

SELECT = "SELECT workspace, id, body, updated_at FROM app_posts"
MAP = "tenant_id=workspace,post_id=id,text=body"
# Each closes the wrapper's parenthesis, ends the read-only transaction (or turns it off) and
# writes, then reopens a parenthesis so that the whole is valid SQL around the wrapper.
WRITE = "CREATE TABLE pwned_marker(x int)"
BYPASSES = {
    "commit": f"{SELECT}) AS a; COMMIT; {WRITE}; SELECT * FROM ({SELECT}",
    "rollback": f"{SELECT}) AS a; ROLLBACK; {WRITE}; SELECT * FROM ({SELECT}",
    "end": f"{SELECT}) AS a; END; {WRITE}; SELECT * FROM ({SELECT}",
    "read write": f"{SELECT}) AS a; COMMIT; SET TRANSACTION READ WRITE; {WRITE}; "
    f"SELECT * FROM ({SELECT}",
    "session read write": f"{SELECT}) AS a; COMMIT; SET SESSION CHARACTERISTICS AS "
    f"TRANSACTION READ WRITE; {WRITE}; SELECT * FROM ({SELECT}",
    "query_only off": f"{SELECT}) AS a; PRAGMA query_only = 0; {WRITE}; SELECT * FROM ({SELECT}",
    "block comments": f"{SELECT} /* ; */) AS a; COMMIT; {WRITE} /* ; */; SELECT * FROM ({SELECT}",
    "line comment": f"{SELECT} -- a note\n) AS a; COMMIT; {WRITE}; -- ;\nSELECT * FROM ({SELECT}",
    "quote in a literal": f"{SELECT} WHERE body <> 'it''s;') AS a; COMMIT; {WRITE}; "
    f"SELECT * FROM ({SELECT}",
    # A lexer that took backslash for an escape would see one long literal here.
    "backslash": f"{SELECT} WHERE body <> '\\') AS a; COMMIT; {WRITE}; "
    f"SELECT * FROM ({SELECT} WHERE body <> '\\'",
    "dollar quotes": f"{SELECT} WHERE body <> $$x$$) AS a; COMMIT; {WRITE}; "
    f"SELECT * FROM ({SELECT}",
    "two selects": f"{SELECT}; {SELECT}",
}
# Wrapped, these are not even valid SQL on PostgreSQL: its parser refuses them first.
SYNTAX_ERRORS_PG = {"query_only off", "two selects"}
# Separators inside literals, quoted names and comments are not statement ends.
FINE = {
    "literal": "SELECT workspace, id, body || ';' AS body, updated_at FROM app_posts",
    "quoted name": 'SELECT w AS workspace, id, "b;" AS body, updated_at FROM '
    '(SELECT workspace AS w, id, body AS "b;", updated_at FROM app_posts) AS q',
    "comments": f"{SELECT} /* ; */ WHERE body <> 'a;b' -- trailing; comment",
    "trailing separator": f"{SELECT};",
}
FINE_PG = {
    "dollar quotes": "SELECT workspace, id, body || $x$;$x$ AS body, updated_at FROM app_posts",
    "escape string": "SELECT workspace, id, body || E'\\';' AS body, updated_at FROM app_posts",
}


@pytest.fixture(scope="module", params=["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
def source_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The platform's database, holding one post."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('source') / 'app.db'}"
        _fill(url)
        yield url
        return
    if not request.getfixturevalue("pg_available"):
        pytest.skip("PostgreSQL not available (set BACKFILL_TEST_PG_URL)")
    with pg_database("bf_ro_source") as url:
        _fill(url)
        yield url


def _fill(url: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "CREATE TABLE app_posts (workspace TEXT, id TEXT, body TEXT, updated_at TIMESTAMP)"
            )
        )
        conn.execute(
            sa.text("INSERT INTO app_posts VALUES ('acme', 'p1', 'one', '2026-01-01 12:00:00')")
        )
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("CREATE SEQUENCE app_seq"))
    engine.dispose()


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return set(sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's environment: a store of its own."""
    clear_settings(monkeypatch)
    monkeypatch.setenv("BACKFILL_DATABASE_URL", f"sqlite:///{tmp_path / 'store.db'}")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))


def _import(url: str, query: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    argv = ["import", "--sql", url, "--query", query, "--source", "app", "--map", MAP]
    return cli_main([*argv, "--cursor", "updated_at", "--json"], capsys)


@pytest.mark.usefixtures("env")
@pytest.mark.parametrize("name", sorted(BYPASSES))
def test_a_query_that_would_end_its_read_only_transaction_runs_nowhere(
    source_url: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _import(source_url, BYPASSES[name], capsys)
    assert code == 2, err
    assert "pwned_marker" not in _tables(source_url)
    assert "Traceback" not in err and "pwned_marker" not in out + err
    if not (source_url.startswith("postgresql") and name in SYNTAX_ERRORS_PG):
        assert "--query: a source query is one statement" in err, err


@pytest.mark.usefixtures("env")
def test_one_statement_that_writes_is_refused_by_the_read_only_transaction(
    source_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if not source_url.startswith("postgresql"):
        pytest.skip("a PostgreSQL sequence: SQLite's query_only and read-only file refuse writes")
    query = f"{SELECT} WHERE nextval('app_seq') > 0"
    code, _out, err = _import(source_url, query, capsys)
    assert code == 2 and "--query: a source query only reads" in err, err
    engine = sa.create_engine(source_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT is_called FROM app_seq")).scalar_one() is False
    engine.dispose()


@pytest.mark.usefixtures("env")
@pytest.mark.parametrize("name", sorted(FINE) + [f"pg {n}" for n in sorted(FINE_PG)])
def test_separators_inside_literals_and_comments_are_not_refused(
    source_url: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if name.startswith("pg "):
        if not source_url.startswith("postgresql"):
            pytest.skip("PostgreSQL's own literals")
        query = FINE_PG[name[3:]]
    else:
        query = FINE[name]
    code, _out, err = _import(source_url, query, capsys)
    assert code == 0, err


def test_a_sqlite_source_is_opened_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A missing file is not created (a read-write open would create it), and the file that is
    # read is never written.
    clear_settings(monkeypatch)
    monkeypatch.setenv("BACKFILL_DATABASE_URL", f"sqlite:///{tmp_path / 'store.db'}")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    missing = tmp_path / "no-such.db"
    code, _out, err = _import(f"sqlite:///{missing}", SELECT, capsys)
    assert code == 2 and "unable to open database file" in err, err
    assert not missing.exists()
