"""The one-statement rule of a source query outside PostgreSQL: SQLite's own tokenizer agrees
on where the first statement ends, and any other database is read so that a separator one of
its lexicons sees is never hidden."""

from __future__ import annotations

import sqlite3

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_assets.platform_db.source_query import Separator, second_statement

# Characters that open and close literals, names and comments elsewhere, inside SQLite's.
INSIDE = st.text(alphabet="';\"`[]-/*\n\\#$ x!", max_size=12)


@st.composite
def sqlite_queries(draw: st.DrawFn) -> str:
    """A valid SQLite query with hostile literals, names and comments, and sometimes a second
    statement after it."""
    parts = []
    for n in range(draw(st.integers(1, 3))):
        literal = "'" + draw(INSIDE).replace("'", "''") + "'"
        name = "[" + draw(INSIDE).replace("]", "") + "]"
        parts.append(f"{literal} AS {name if n else 'a'}")
    query = "SELECT " + ", ".join(parts)
    for _ in range(draw(st.integers(0, 2))):
        if draw(st.booleans()):
            query += " /*" + draw(INSIDE).replace("*/", "") + "*/"
        else:
            query += " --" + draw(INSIDE).replace("\n", "") + "\n"
    if draw(st.booleans()):
        query += ";" + draw(st.sampled_from(["", " ", "\n-- done", " /* ; */"]))
    if draw(st.booleans()):
        query += draw(st.sampled_from([";", " ;\n"])) + " SELECT 2"
    return query


@given(sqlite_queries())
def test_sqlite_and_the_rule_agree_on_one_statement(query: str) -> None:
    # The driver itself is the judge: it runs one statement and refuses anything after it.
    db = sqlite3.connect(":memory:")
    try:
        db.execute(query).fetchall()
        one = True
    except sqlite3.ProgrammingError as exc:
        assert "one statement" in str(exc)
        one = False
    finally:
        db.close()
    assert (second_statement(query, "sqlite") is None) == one, query


@pytest.mark.parametrize(
    ("query", "where"),
    [
        ("SELECT 1; SELECT 2", (1, 9)),
        ("SELECT 1;\n  -- note\n  DROP TABLE t", (1, 9)),
        ("SELECT 'a;b'; x", (1, 13)),
        ("SELECT [a;b]; x", (1, 13)),
        ("SELECT 1 /* ; */; x", (1, 17)),
        ("SELECT 'it''s';\nx", (1, 15)),
        ("SELECT '\\'; x", (1, 11)),
    ],
)
def test_sqlite_names_the_separator_that_another_statement_follows(
    query: str, where: tuple[int, int]
) -> None:
    assert second_statement(query, "sqlite") == Separator(*where)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT 1",
        "SELECT 1;",
        "SELECT 1; ;\n -- done; really\n /* ; */",
        "SELECT 'a;b', \"c;d\", `e;f`, [g;h] -- ;",
        "SELECT 'unterminated; x",
    ],
)
def test_sqlite_takes_one_statement_with_separators_in_literals_and_comments(query: str) -> None:
    assert second_statement(query, "sqlite") is None


@pytest.mark.parametrize(
    "query",
    [
        "SELECT 'a\\'; DROP TABLE t; --'",  # one literal to MySQL, not to the standard
        "SELECT 'a\\\\'; DROP TABLE t",  # a literal backslash, then a statement
        "SELECT 1 # ; \n; DROP TABLE t",
        "SELECT 1 --x; DROP TABLE t",  # MySQL: '--x' is no comment
        "SELECT 1 /*! ; DROP TABLE t */",  # MySQL runs /*! ... */
        "SELECT [a; DROP TABLE t; --]",  # no brackets in MySQL
        "SELECT $$; DROP TABLE t; $$",  # no dollar quotes assumed
    ],
)
def test_another_database_refuses_a_separator_any_of_its_lexicons_sees(query: str) -> None:
    assert second_statement(query, "mysql") is not None


def test_another_database_takes_separators_inside_every_lexicons_literals() -> None:
    assert second_statement("SELECT 'a;b', \"c;d\" -- ;\n;", "mssql") is None
