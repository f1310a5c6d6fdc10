"""YAML read with the position of every value and every key, for the files checked field by
field (the policy, the cascade): every problem with its 1-based line and column, as a compiler
prints it, and never a traceback, whatever the file holds (pure).

``read_text`` reads a file (bounded, UTF-8), ``parse_yaml`` its text into plain values and a
``Tree`` of their positions; each file's own checks then report against the tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# Far above any real file; bounds the parse (aliases count each time they are read).
MAX_NODES = 100_000
_SHOWN = 40

YamlPath = tuple[int | str, ...]


@dataclass(frozen=True, slots=True)
class FileProblem:
    """One thing wrong with a file, where it is (1-based line and column)."""

    line: int
    column: int
    message: str

    def render(self, source: str) -> str:
        """``FILE:LINE:COLUMN: message``, as compilers print it."""
        return f"{source}:{self.line}:{self.column}: {self.message}"


class FileInvalid(ValueError):
    """A file with problems; ``problems`` lists every one of them (``what``: the kind of
    file, as the message names it)."""

    what = "file"

    def __init__(self, source: str, problems: Sequence[FileProblem]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = [p.render(source) for p in self.problems]
        super().__init__(f"{len(lines)} problem(s) in {self.what} {source}:\n" + "\n".join(lines))


def quoted(value: str) -> str:
    """A user's value in a message: quoted, and cut short."""
    return repr(value[:_SHOWN] + ("..." if len(value) > _SHOWN else ""))


def describe(path: YamlPath, whole: str) -> str:
    """``labels[2].id``; ``whole`` (``the policy``) for the document itself."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or whole


class Tree:
    """A YAML document as plain values, with the position of every value and every key.

    ``whole`` names the document in messages (``the policy``, ``the cascade``)."""

    def __init__(self, loader: yaml.SafeLoader, whole: str) -> None:
        self._loader = loader
        self.whole = whole
        self.at: dict[YamlPath, tuple[int, int]] = {}
        self.key_at: dict[YamlPath, tuple[int, int]] = {}
        self.problems: list[FileProblem] = []
        # Scalars already reported as unreadable (their field's check says nothing more).
        self.unreadable: set[YamlPath] = set()
        self._nodes = 0

    def value(self, node: yaml.Node, path: YamlPath) -> Any:
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise _TooBig
        self.at[path] = _mark(node)
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = self._loader.construct_object(key_node)
                if not isinstance(key, str):
                    line, col = _mark(key_node)
                    self.problems.append(FileProblem(line, col, "a key that is not text"))
                    continue
                if key in out:
                    line, col = _mark(key_node)
                    where = describe(path, self.whole)
                    self.problems.append(
                        FileProblem(line, col, f"duplicate key {quoted(key)} in {where}")
                    )
                    continue
                self.key_at[(*path, key)] = _mark(key_node)
                out[key] = self.value(value_node, (*path, key))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.value(item, (*path, i)) for i, item in enumerate(node.value)]
        try:
            return self._loader.construct_object(node)
        except (ValueError, OverflowError):
            # A plain scalar YAML resolves to a number or a date it cannot hold: 5,000 digits
            # (Python's int() refuses over 4,300), 2020-13-45. Reported here, once, at its
            # place; the field's own check then sees the text as written.
            line, col = _mark(node)
            kind = _SCALAR_KINDS.get(node.tag, "value")
            self.problems.append(
                FileProblem(
                    line,
                    col,
                    f"{describe(path, self.whole)}: {quoted(node.value)} is not a {kind} YAML "
                    "can read (quote it to mean text)",
                )
            )
            self.unreadable.add(path)
            return node.value

    def where(self, path: YamlPath, key: bool = False) -> tuple[int, int]:
        """The position of ``path`` (of its key with ``key``), else of its nearest parent."""
        if key and path in self.key_at:
            return self.key_at[path]
        while path and path not in self.at:
            path = path[:-1]
        return self.at.get(path, (1, 1))


class _TooBig(Exception):
    pass


_SCALAR_KINDS = {
    "tag:yaml.org,2002:int": "number",
    "tag:yaml.org,2002:float": "number",
    "tag:yaml.org,2002:timestamp": "date",
}


def _mark(node: yaml.Node) -> tuple[int, int]:
    mark = node.start_mark
    return (mark.line + 1, mark.column + 1)


def parse_yaml(text: str, whole: str, empty: str) -> tuple[Any, Tree] | FileProblem:
    """The document's plain values and their positions, or the one problem that stops the
    reading (``empty``: the message for a file with no document)."""
    try:
        # The reader refuses control characters as it is built, before any mark exists.
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:
        before = text[: exc.position]
        line, col = before.count("\n") + 1, len(before) - before.rfind("\n")
        char = exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or "?")
        return FileProblem(line, col, f"character U+{char:04X} is not allowed in YAML")
    try:
        node = loader.get_single_node()
        tree = Tree(loader, whole)
        if node is None:
            return FileProblem(1, 1, empty)
        return tree.value(node, ()), tree
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        return FileProblem(line, col, f"YAML syntax: {exc.problem or exc.context}")
    except yaml.YAMLError as exc:
        return FileProblem(1, 1, f"YAML: {type(exc).__name__}")
    except (_TooBig, RecursionError):
        return FileProblem(1, 1, f"more than {MAX_NODES} YAML nodes")
    finally:
        loader.dispose()


def too_large(text: str, max_bytes: int) -> FileProblem | None:
    """The problem of a text over ``max_bytes`` in UTF-8, else None."""
    if len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        return FileProblem(1, 1, f"larger than {max_bytes} bytes")
    return None


def read_text(path: str | Path, max_bytes: int) -> str | FileProblem:
    """A file's text (a leading byte-order mark dropped), or why it cannot be read: missing,
    over ``max_bytes``, not UTF-8."""
    try:
        with Path(path).open("rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        return FileProblem(1, 1, f"cannot read: {exc.strerror or exc}")
    if len(raw) > max_bytes:
        return FileProblem(1, 1, f"larger than {max_bytes} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return FileProblem(raw[: exc.start].count(b"\n") + 1, 1, "not valid UTF-8")
    return text.removeprefix("\ufeff")
