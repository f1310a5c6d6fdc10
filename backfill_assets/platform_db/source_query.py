"""A source query is one statement: the first ``;`` outside literals and comments that another
statement follows, for the sources whose driver would run a script (a PostgreSQL source is held
to one statement by its server instead: ``source_db.py`` opens it as one cursor).

SQLite's lexicon is exact. Any other database is read with both SQLite's and MySQL's (backslash
escapes, ``#`` comments, ``/*! code */``) and a separator either finds counts, so the check may
refuse a query that database would take as one statement, never the other way round.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

_SPACE = " \t\n\r\f\v"


@dataclass(frozen=True)
class Lexicon:
    """What a database's SQL counts as a literal or a comment."""

    backslash_escapes: bool  # 'it\'s' is one literal
    hash_comments: bool  # '#' comments to the end of the line
    dash_comment_needs_space: bool  # '--' comments only before a space ('--1' is minus minus 1)
    brackets: bool  # [a name] is a quoted identifier
    bang_is_code: bool  # /*! ... */ is run, not skipped


SQLITE = Lexicon(False, False, False, True, False)
MYSQL = Lexicon(True, True, True, False, True)


@dataclass(frozen=True)
class Separator:
    """The ``;`` that ends a query's first statement with more after it (1-based)."""

    line: int
    column: int


def second_statement(query: str, dialect: str) -> Separator | None:
    """Where ``query`` holds a second statement (``None``: one statement; a trailing ``;``
    followed only by space and comments is not a second one)."""
    for lexicon in (SQLITE,) if dialect == "sqlite" else (SQLITE, MYSQL):
        first: int | None = None
        for at, is_separator in _tokens(query, lexicon):
            if is_separator:
                first = at if first is None else first
            elif first is not None:
                line = query.count("\n", 0, first) + 1
                return Separator(line, first - query.rfind("\n", 0, first))
    return None


def _tokens(text: str, lex: Lexicon) -> Iterator[tuple[int, bool]]:
    """The offset of each token outside comments and space, and whether it is a ``;``."""
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in _SPACE:
            i += 1
        elif _line_comment(text, i, lex):
            end = text.find("\n", i)
            i = n if end < 0 else end + 1
        elif text.startswith("/*", i) and not (lex.bang_is_code and text.startswith("/*!", i)):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif ch in "'\"`" or (ch == "[" and lex.brackets):
            yield i, False
            i = _after_quoted(text, i, lex)
        else:
            yield i, ch == ";"
            i += 1


def _line_comment(text: str, i: int, lex: Lexicon) -> bool:
    if lex.hash_comments and text[i] == "#":
        return True
    if not text.startswith("--", i):
        return False
    return not lex.dash_comment_needs_space or i + 2 >= len(text) or text[i + 2] in _SPACE


def _after_quoted(text: str, start: int, lex: Lexicon) -> int:
    """The offset after the literal or quoted name opening at ``start`` (the text's end if it
    is never closed): a doubled quote stays inside, and so does an escaped one in a lexicon
    with backslash escapes."""
    close = "]" if text[start] == "[" else text[start]
    escapes = lex.backslash_escapes and close in "'\""
    i, n = start + 1, len(text)
    while i < n:
        ch = text[i]
        if escapes and ch == "\\":
            i += 2
        elif ch == close:
            if close != "]" and text.startswith(close, i + 1):
                i += 2
            else:
                return i + 1
        else:
            i += 1
    return n
