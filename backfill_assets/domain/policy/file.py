"""Reading a policy file: YAML checked field by field, every problem with its line and column.

``load_policy`` reads a file (``BACKFILL_POLICY_PATH``), ``parse_policy`` its text, and
``builtin_policy`` the one shipped inside the package; each returns a ``Policy`` or raises
``PolicyInvalid`` listing every problem, as a compiler would.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from backfill_assets.domain.policy.document import ACTIONS, Policy, PolicyDoc
from backfill_assets.domain.yaml_positions import (
    FileInvalid,
    FileProblem,
    Tree,
    YamlPath,
    describe,
    parse_yaml,
    quoted,
    read_text,
    too_large,
)

# Far above any real policy; bounds the parse.
MAX_POLICY_BYTES = 1 << 20

BUILTIN_POLICY_FILE = "default.yaml"
_WHOLE = "the policy"


class PolicyInvalid(FileInvalid):
    """A policy file with problems; ``problems`` lists every one of them."""

    what = "policy"


def _where(path: YamlPath) -> str:
    return describe(path, _WHOLE)


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


def _pydantic_problems(exc: ValidationError, tree: Tree) -> Iterator[FileProblem]:
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
        yield FileProblem(line, col, msg)


def _items(data: Any, name: str) -> list[tuple[int, dict[str, Any]]]:
    got = data.get(name) if isinstance(data, dict) else None
    if not isinstance(got, list):
        return []
    return [(i, item) for i, item in enumerate(got) if isinstance(item, dict)]


def _semantic_problems(data: Any, tree: Tree) -> Iterator[FileProblem]:
    """Problems of the whole: duplicates, rules to unknown labels, the one ``none`` label.

    Read from the raw values, so they are reported beside any field error in the same run.
    """
    labels = _items(data, "labels")
    raw_labels = data.get("labels") if isinstance(data, dict) else None
    if isinstance(raw_labels, list) and not raw_labels:
        line, col = tree.where(("labels",))
        yield FileProblem(line, col, "labels: empty; a policy needs at least one label")
    first_label: dict[str, tuple[int, int]] = {}
    nones: list[tuple[int, str]] = []
    for i, label in labels:
        lid = label.get("id")
        if isinstance(lid, str):
            if lid in first_label:
                line, col = tree.where(("labels", i, "id"))
                yield FileProblem(
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
        yield FileProblem(
            line, col, "labels: no label has action none (exactly one says nothing applies)"
        )
    for i, lid in nones[1:]:
        line, col = tree.where(("labels", i, "action"))
        yield FileProblem(
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
                yield FileProblem(
                    line, col, f"duplicate rule id {quoted(rid)} (first at line {first_rule[rid]})"
                )
            else:
                first_rule[rid] = tree.where(("rules", i, "id"))[0]
        target = rule.get("label")
        if isinstance(target, str) and labels and target not in first_label:
            line, col = tree.where(("rules", i, "label"))
            yield FileProblem(line, col, f"rules[{i}]: leads to unknown label {quoted(target)}")
    yield from _dialect_problems(data, tree, first_label, _rule_targets(data))


def _rule_targets(data: Any) -> dict[str, Any]:
    """Rule id -> the label it leads to, as written."""
    return {
        str(r["id"]): r.get("label")
        for _i, r in _items(data, "rules")
        if isinstance(r.get("id"), str)
    }


def _dialect_problems(
    data: Any, tree: Tree, labels: Mapping[str, Any], rules: Mapping[str, Any]
) -> Iterator[FileProblem]:
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
            yield FileProblem(
                line, col, f"category {quoted(str(name))}: unknown label {quoted(label)}"
            )
        if isinstance(rule, str):
            if rule not in rules:
                line, col = tree.where((*base, name, "rule"))
                yield FileProblem(
                    line, col, f"category {quoted(str(name))}: unknown rule {quoted(rule)}"
                )
            elif isinstance(label, str) and rules[rule] != label:
                line, col = tree.where((*base, name, "rule"))
                yield FileProblem(
                    line,
                    col,
                    f"category {quoted(str(name))}: rule {quoted(rule)} leads to "
                    f"{quoted(str(rules[rule]))}, not to {quoted(label)}",
                )


def _guard_problems(dialects: Any, tree: Tree, rules: Mapping[str, Any]) -> Iterator[FileProblem]:
    """``dialects: llama-guard: categories:`` maps each code to one of the policy's rules."""
    section = dialects.get("llama-guard") if isinstance(dialects, dict) else None
    categories = section.get("categories") if isinstance(section, dict) else None
    if not isinstance(categories, dict):
        return
    for code, rule in categories.items():
        if isinstance(rule, str) and rule not in rules:
            line, col = tree.where(("dialects", "llama-guard", "categories", code))
            yield FileProblem(
                line, col, f"category {quoted(str(code))}: unknown rule {quoted(rule)}"
            )


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Check a policy's YAML text; ``PolicyInvalid`` lists every problem with line and column."""
    if (big := too_large(text, MAX_POLICY_BYTES)) is not None:
        raise PolicyInvalid(source, [big])
    parsed = parse_yaml(text, _WHOLE, "the file is empty: a policy needs id, version, ...")
    if isinstance(parsed, FileProblem):
        raise PolicyInvalid(source, [parsed])
    data, tree = parsed
    problems = list(tree.problems)
    if not isinstance(data, dict):
        line, col = tree.where(())
        raise PolicyInvalid(
            source, [*problems, FileProblem(line, col, "a policy is a mapping of fields")]
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
    text = read_text(path, MAX_POLICY_BYTES)
    if isinstance(text, FileProblem):
        raise PolicyInvalid(str(path), [text])
    return parse_policy(text, str(path))


def builtin_policy_text() -> str:
    """The built-in policy file's text (shipped inside the package)."""
    return (resources.files("backfill_assets") / "policies" / BUILTIN_POLICY_FILE).read_text(
        "utf-8"
    )


@functools.cache
def builtin_policy() -> Policy:
    """The built-in policy: today's four labels, ``ok`` when nothing applies."""
    return parse_policy(builtin_policy_text(), f"<built-in {BUILTIN_POLICY_FILE}>")
