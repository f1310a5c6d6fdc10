"""Reading a policy file: YAML checked field by field, every problem with its line and column.

``load_policy`` reads a file (``BACKFILL_POLICY_PATH``), ``parse_policy`` its text, and
``builtin_policy`` the one shipped inside the package; each returns a ``Policy`` or raises
``PolicyInvalid`` listing every problem, as a compiler would.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from backfill_assets.domain.policy.document import ACTIONS, Policy, PolicyDoc
from backfill_assets.domain.policy.items import quoted

# Far above any real policy; bounds the parse.
MAX_POLICY_BYTES = 1 << 20
_MAX_NODES = 100_000

BUILTIN_POLICY_FILE = "default.yaml"


@dataclass(frozen=True, slots=True)
class PolicyProblem:
    """One thing wrong with a policy file, where it is (1-based line and column)."""

    line: int
    column: int
    message: str

    def render(self, source: str) -> str:
        """``FILE:LINE:COLUMN: message``, as compilers print it."""
        return f"{source}:{self.line}:{self.column}: {self.message}"


class PolicyInvalid(ValueError):
    """A policy file with problems; ``problems`` lists every one of them."""

    def __init__(self, source: str, problems: Sequence[PolicyProblem]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = [p.render(source) for p in self.problems]
        super().__init__(f"{len(lines)} problem(s) in policy {source}:\n" + "\n".join(lines))


Path_ = tuple[int | str, ...]


class _Tree:
    """A YAML document as plain values, with the position of every value and every key."""

    def __init__(self, loader: yaml.SafeLoader) -> None:
        self._loader = loader
        self.at: dict[Path_, tuple[int, int]] = {}
        self.key_at: dict[Path_, tuple[int, int]] = {}
        self.problems: list[PolicyProblem] = []
        # Scalars already reported as unreadable (their field's check says nothing more).
        self.unreadable: set[Path_] = set()
        self._nodes = 0

    def value(self, node: yaml.Node, path: Path_) -> Any:
        self._nodes += 1
        if self._nodes > _MAX_NODES:
            raise _TooBig
        self.at[path] = _mark(node)
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = self._loader.construct_object(key_node)
                if not isinstance(key, str):
                    line, col = _mark(key_node)
                    self.problems.append(PolicyProblem(line, col, "a key that is not text"))
                    continue
                if key in out:
                    line, col = _mark(key_node)
                    self.problems.append(
                        PolicyProblem(line, col, f"duplicate key {quoted(key)} in {_where(path)}")
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
                PolicyProblem(
                    line,
                    col,
                    f"{_where(path)}: {quoted(node.value)} is not a {kind} YAML can read "
                    "(quote it to mean text)",
                )
            )
            self.unreadable.add(path)
            return node.value

    def where(self, path: Path_, key: bool = False) -> tuple[int, int]:
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


def _where(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the policy"


def _parse_yaml(text: str) -> tuple[Any, _Tree] | PolicyProblem:
    try:
        # The reader refuses control characters as it is built, before any mark exists.
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:
        before = text[: exc.position]
        line, col = before.count("\n") + 1, len(before) - before.rfind("\n")
        char = exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or "?")
        return PolicyProblem(line, col, f"character U+{char:04X} is not allowed in YAML")
    try:
        node = loader.get_single_node()
        tree = _Tree(loader)
        if node is None:
            return PolicyProblem(1, 1, "the file is empty: a policy needs id, version, ...")
        return tree.value(node, ()), tree
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        return PolicyProblem(line, col, f"YAML syntax: {exc.problem or exc.context}")
    except yaml.YAMLError as exc:
        return PolicyProblem(1, 1, f"YAML: {type(exc).__name__}")
    except (_TooBig, RecursionError):
        return PolicyProblem(1, 1, f"more than {_MAX_NODES} YAML nodes")
    finally:
        loader.dispose()


# ------------------------------------------------------------------------------------ checking

_MESSAGES = {
    "missing": "missing field",
    "extra_forbidden": "unknown field",
    "literal_error": f"must be one of {', '.join(ACTIONS)}",
    "string_type": "must be text",
    "list_type": "must be a list",
    "model_type": "must be a mapping of fields",
    "dict_type": "must be a mapping of fields",
    "too_long": "too many items",
}


def _pydantic_problems(exc: ValidationError, tree: _Tree) -> Iterator[PolicyProblem]:
    for err in exc.errors():
        loc = tuple(err["loc"])
        kind = err["type"]
        if loc in tree.unreadable or loc[:-1] in tree.unreadable:
            continue
        # A union's members each report; the first says enough (severity: int | str).
        if kind in ("int_type", "string_type") and loc and loc[-1] in ("int", "str"):
            loc = loc[:-1]
            kind = "severity_type"
        name = _where(loc)
        if kind == "missing":
            line, col = tree.where(loc[:-1])
            msg = f"{_where(loc[:-1])}: missing field {loc[-1]!r}"
        elif kind == "extra_forbidden":
            line, col = tree.where(loc, key=True)
            msg = f"{_where(loc[:-1])}: unknown field {quoted(str(loc[-1]))}"
        elif kind == "severity_type":
            line, col = tree.where(loc)
            msg = f"{name}: must be a number or a short word"
        else:
            line, col = tree.where(loc)
            text = _MESSAGES.get(kind) or str(err.get("msg", kind)).removeprefix("Value error, ")
            msg = f"{name}: {text}"
        yield PolicyProblem(line, col, msg)


def _items(data: Any, name: str) -> list[tuple[int, dict[str, Any]]]:
    got = data.get(name) if isinstance(data, dict) else None
    if not isinstance(got, list):
        return []
    return [(i, item) for i, item in enumerate(got) if isinstance(item, dict)]


def _semantic_problems(data: Any, tree: _Tree) -> Iterator[PolicyProblem]:
    """Problems of the whole: duplicates, rules to unknown labels, the one ``none`` label.

    Read from the raw values, so they are reported beside any field error in the same run.
    """
    labels = _items(data, "labels")
    raw_labels = data.get("labels") if isinstance(data, dict) else None
    if isinstance(raw_labels, list) and not raw_labels:
        line, col = tree.where(("labels",))
        yield PolicyProblem(line, col, "labels: empty; a policy needs at least one label")
    first_label: dict[str, tuple[int, int]] = {}
    nones: list[tuple[int, str]] = []
    for i, label in labels:
        lid = label.get("id")
        if isinstance(lid, str):
            if lid in first_label:
                line, col = tree.where(("labels", i, "id"))
                yield PolicyProblem(
                    line,
                    col,
                    f"duplicate label id {quoted(lid)} (first at line {first_label[lid][0]})",
                )
            else:
                first_label[lid] = tree.where(("labels", i, "id"))
        if label.get("action") == "none":
            nones.append((i, str(lid)))
    if labels and not nones:
        line, col = tree.where(("labels",))
        yield PolicyProblem(
            line, col, "labels: no label has action none (exactly one says nothing applies)"
        )
    for i, lid in nones[1:]:
        line, col = tree.where(("labels", i, "action"))
        yield PolicyProblem(
            line,
            col,
            f"labels[{i}]: a second label with action none ({quoted(lid)}; the first is "
            f"{quoted(nones[0][1])}): exactly one label says nothing applies",
        )
    first_rule: dict[str, int] = {}
    for i, rule in _items(data, "rules"):
        rid = rule.get("id")
        if isinstance(rid, str):
            if rid in first_rule:
                line, col = tree.where(("rules", i, "id"))
                yield PolicyProblem(
                    line, col, f"duplicate rule id {quoted(rid)} (first at line {first_rule[rid]})"
                )
            else:
                first_rule[rid] = tree.where(("rules", i, "id"))[0]
        target = rule.get("label")
        if isinstance(target, str) and labels and target not in first_label:
            line, col = tree.where(("rules", i, "label"))
            yield PolicyProblem(line, col, f"rules[{i}]: leads to unknown label {quoted(target)}")
    yield from _dialect_problems(data, tree, first_label, _rule_targets(data))


def _rule_targets(data: Any) -> dict[str, Any]:
    """Rule id -> the label it leads to, as written."""
    return {
        str(r["id"]): r.get("label")
        for _i, r in _items(data, "rules")
        if isinstance(r.get("id"), str)
    }


def _dialect_problems(
    data: Any, tree: _Tree, labels: Mapping[str, Any], rules: Mapping[str, Any]
) -> Iterator[PolicyProblem]:
    """A dialect's mapping names the policy's own labels and rules, each rule of its label."""
    dialects = data.get("dialects") if isinstance(data, dict) else None
    yield from _guard_problems(dialects, tree, rules)
    section = dialects.get("openai-moderation") if isinstance(dialects, dict) else None
    categories = section.get("categories") if isinstance(section, dict) else None
    if not isinstance(categories, dict):
        return
    base = ("dialects", "openai-moderation", "categories")
    for name, entry in categories.items():
        if not isinstance(entry, dict):
            continue
        label, rule = entry.get("label"), entry.get("rule")
        if isinstance(label, str) and labels and label not in labels:
            line, col = tree.where((*base, name, "label"))
            yield PolicyProblem(
                line, col, f"category {quoted(str(name))}: unknown label {quoted(label)}"
            )
        if isinstance(rule, str):
            if rule not in rules:
                line, col = tree.where((*base, name, "rule"))
                yield PolicyProblem(
                    line, col, f"category {quoted(str(name))}: unknown rule {quoted(rule)}"
                )
            elif isinstance(label, str) and rules[rule] != label:
                line, col = tree.where((*base, name, "rule"))
                yield PolicyProblem(
                    line,
                    col,
                    f"category {quoted(str(name))}: rule {quoted(rule)} leads to "
                    f"{quoted(str(rules[rule]))}, not to {quoted(label)}",
                )


def _guard_problems(
    dialects: Any, tree: _Tree, rules: Mapping[str, Any]
) -> Iterator[PolicyProblem]:
    """``dialects: llama-guard: categories:`` maps each code to one of the policy's rules."""
    section = dialects.get("llama-guard") if isinstance(dialects, dict) else None
    categories = section.get("categories") if isinstance(section, dict) else None
    if not isinstance(categories, dict):
        return
    for code, rule in categories.items():
        if isinstance(rule, str) and rule not in rules:
            line, col = tree.where(("dialects", "llama-guard", "categories", code))
            yield PolicyProblem(
                line, col, f"category {quoted(str(code))}: unknown rule {quoted(rule)}"
            )


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Check a policy's YAML text; ``PolicyInvalid`` lists every problem with line and column."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_POLICY_BYTES:
        raise PolicyInvalid(source, [PolicyProblem(1, 1, f"larger than {MAX_POLICY_BYTES} bytes")])
    parsed = _parse_yaml(text)
    if isinstance(parsed, PolicyProblem):
        raise PolicyInvalid(source, [parsed])
    data, tree = parsed
    problems = list(tree.problems)
    if not isinstance(data, dict):
        line, col = tree.where(())
        raise PolicyInvalid(
            source, [*problems, PolicyProblem(line, col, "a policy is a mapping of fields")]
        )
    doc: PolicyDoc | None = None
    try:
        doc = PolicyDoc.model_validate(data)
    except ValidationError as exc:
        problems.extend(_pydantic_problems(exc, tree))
    problems.extend(_semantic_problems(data, tree))
    if problems or doc is None:
        problems.sort(key=lambda p: (p.line, p.column))
        raise PolicyInvalid(source, problems)
    return Policy(doc)


def load_policy(path: str | Path) -> Policy:
    """Read and check a policy file (``PolicyInvalid`` when it cannot be used)."""
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        problem = PolicyProblem(1, 1, f"cannot read: {exc.strerror or exc}")
        raise PolicyInvalid(source, [problem]) from None
    if len(raw) > MAX_POLICY_BYTES:
        raise PolicyInvalid(source, [PolicyProblem(1, 1, f"larger than {MAX_POLICY_BYTES} bytes")])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise PolicyInvalid(source, [PolicyProblem(line, 1, "not valid UTF-8")]) from None
    return parse_policy(text.removeprefix("\ufeff"), source)


def builtin_policy_text() -> str:
    """The built-in policy file's text (shipped inside the package)."""
    return (resources.files("backfill_assets") / "policies" / BUILTIN_POLICY_FILE).read_text(
        "utf-8"
    )


@functools.cache
def builtin_policy() -> Policy:
    """The built-in policy: today's four labels, ``ok`` when nothing applies."""
    return parse_policy(builtin_policy_text(), f"<built-in {BUILTIN_POLICY_FILE}>")
