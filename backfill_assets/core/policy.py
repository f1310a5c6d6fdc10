"""The moderation policy: the user's labels, rules and instructions as a versioned YAML file.

A policy is data, not code: ``BACKFILL_POLICY_PATH`` names the file (the default is the
built-in ``policies/default.yaml``), ``load_policy`` checks it and reports every problem with
its line and column, and ``Policy`` gives its identity: its id, its human version and a hash of
its canonical content (comments and key order do not count; every word does). That identity
names the work: it is part of every key and of the labels asset's code version.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from backfill_assets.core.keys import TENANT_ID_RE

# Rule and label ids: short, stable, and safe anywhere (keys, SQL, CSV, a comma-joined list).
ITEM_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$")
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,39}$")
ACTIONS = ("none", "review", "hide")
Action = Literal["none", "review", "hide"]
# Far above any real policy; bounds the parse (and the prompt every call pays for).
MAX_POLICY_BYTES = 1 << 20
_MAX_NODES = 100_000
_MAX_TEXT = 100_000
_SHOWN = 40

BUILTIN_POLICY_FILE = "default.yaml"
# The built-in policy, exactly as shipped, keys its work with the prompt version today's
# results were stored under before policies were files (the sha256 of that prompt), so an
# upgraded store re-pays nothing. Any other content, an edited copy included, keys by its own
# identity. A test pins both halves (docs/policies.md, "Upgrading").
BUILTIN_CONTENT_HASH = "f26961e0a5c1f71ec62d4c573faf1c0eb24819bd7b9ce052d6c3584ad3e55431"
LEGACY_KEY_VERSIONS: Mapping[str, str] = {BUILTIN_CONTENT_HASH: "policy@d0f22620582d"}


class _Item(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("empty")
    if len(value) > _MAX_TEXT:
        raise ValueError(f"longer than {_MAX_TEXT} characters")
    if "\x00" in value:
        raise ValueError("contains NUL characters")
    return value


class Examples(_Item):
    """Posts that break a rule and posts that do not, for the model to read."""

    violates: list[str] = Field(default_factory=list, max_length=100)
    safe: list[str] = Field(default_factory=list, max_length=100)

    @field_validator("violates", "safe")
    @classmethod
    def _texts(cls, value: list[str]) -> list[str]:
        return [_text(v) for v in value]


class LabelDef(_Item):
    """One label of the closed set, and what applying it means to the platform."""

    id: str
    description: str
    action: Action
    severity: int | str | None = None

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        return _item_id(value)

    @field_validator("description")
    @classmethod
    def _description(cls, value: str) -> str:
        return _text(value)

    @field_validator("severity")
    @classmethod
    def _severity(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, str) and not VERSION_RE.fullmatch(value):
            raise ValueError(f"severity {_show(value)} must match {VERSION_RE.pattern}")
        return value


class RuleDef(_Item):
    """A rule: a stable id, the label it leads to, its text and examples."""

    id: str
    label: str
    description: str
    examples: Examples = Field(default_factory=Examples)

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        return _item_id(value)

    @field_validator("description")
    @classmethod
    def _description(cls, value: str) -> str:
        return _text(value)


class PolicyDoc(_Item):
    """The policy file's content, validated (``extra="forbid"``: an unknown field is an error)."""

    id: str
    version: str
    instructions: str
    labels: list[LabelDef] = Field(max_length=256)
    rules: list[RuleDef] = Field(default_factory=list, max_length=1024)

    @field_validator("id")
    @classmethod
    def _policy_id(cls, value: str) -> str:
        if not TENANT_ID_RE.fullmatch(value):
            raise ValueError(f"bad id {_show(value)}: must match {TENANT_ID_RE.pattern}")
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> Any:
        # YAML reads 5 as an integer; 5.10 would be the float 5.1, so floats are refused.
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if isinstance(value, str) and not VERSION_RE.fullmatch(value):
            raise ValueError(f"bad version {_show(value)}: must match {VERSION_RE.pattern}")
        if not isinstance(value, str):
            raise ValueError('version must be text such as "5" (quote it)')
        return value

    @field_validator("instructions")
    @classmethod
    def _instructions(cls, value: str) -> str:
        return _text(value)


def _show(value: str) -> str:
    return repr(value[:_SHOWN] + ("..." if len(value) > _SHOWN else ""))


def _item_id(value: str) -> str:
    if not ITEM_ID_RE.fullmatch(value):
        raise ValueError(f"bad id {_show(value)}: must match {ITEM_ID_RE.pattern}")
    return value


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


class Policy:
    """A checked policy and its identity.

    ``content_hash``: sha256 of the canonical JSON of the content (every field, key order and
    comments aside). ``identity``: ``<id>@<version>#<hash[:16]>``. ``key_version``: what keys
    and the code version carry: the identity, except for the built-in policy as shipped.
    """

    __slots__ = ("content_hash", "doc")

    def __init__(self, doc: PolicyDoc) -> None:
        self.doc = doc
        self.content_hash = hashlib.sha256(canonical_json(doc).encode("utf-8")).hexdigest()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Policy) and other.content_hash == self.content_hash

    def __hash__(self) -> int:
        return hash(self.content_hash)

    def __repr__(self) -> str:
        return f"Policy({self.identity})"

    @property
    def policy_id(self) -> str:
        """The policy's id (the tenant-id pattern); ``applied_labels`` is keyed by it."""
        return self.doc.id

    @property
    def version(self) -> str:
        """The human version, such as ``5``."""
        return self.doc.version

    @property
    def identity(self) -> str:
        """Id, human version and content hash: changes with every word of the policy."""
        return f"{self.doc.id}@{self.doc.version}#{self.content_hash[:16]}"

    @property
    def key_version(self) -> str:
        """The policy's part of every key and of the code version."""
        return LEGACY_KEY_VERSIONS.get(self.content_hash, self.identity)

    @property
    def label_ids(self) -> tuple[str, ...]:
        """The closed label set, in the file's order."""
        return tuple(label.id for label in self.doc.labels)

    @property
    def none_label(self) -> str:
        """The label with action ``none``: nothing in the policy applies."""
        return next(label.id for label in self.doc.labels if label.action == "none")

    @property
    def flagging_labels(self) -> tuple[str, ...]:
        """Labels whose action is not ``none`` (what ``label_drift`` watches by default)."""
        return tuple(label.id for label in self.doc.labels if label.action != "none")

    @property
    def rule_labels(self) -> tuple[tuple[str, str], ...]:
        """(rule id, the label it leads to), in the file's order."""
        return tuple((rule.id, rule.label) for rule in self.doc.rules)


def canonical_json(doc: PolicyDoc) -> str:
    """The content as sorted, compact JSON: the same policy gives the same text."""
    return json.dumps(
        doc.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


# ---------------------------------------------------------------------------- YAML, with marks

Path_ = tuple[int | str, ...]


class _Tree:
    """A YAML document as plain values, with the position of every value and every key."""

    def __init__(self, loader: yaml.SafeLoader) -> None:
        self._loader = loader
        self.at: dict[Path_, tuple[int, int]] = {}
        self.key_at: dict[Path_, tuple[int, int]] = {}
        self.problems: list[PolicyProblem] = []
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
                        PolicyProblem(line, col, f"duplicate key {_show(key)} in {_where(path)}")
                    )
                    continue
                self.key_at[(*path, key)] = _mark(key_node)
                out[key] = self.value(value_node, (*path, key))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.value(item, (*path, i)) for i, item in enumerate(node.value)]
        return self._loader.construct_object(node)

    def where(self, path: Path_, key: bool = False) -> tuple[int, int]:
        """The position of ``path`` (of its key with ``key``), else of its nearest parent."""
        if key and path in self.key_at:
            return self.key_at[path]
        while path and path not in self.at:
            path = path[:-1]
        return self.at.get(path, (1, 1))


class _TooBig(Exception):
    pass


def _mark(node: yaml.Node) -> tuple[int, int]:
    mark = node.start_mark
    return (mark.line + 1, mark.column + 1)


def _where(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the policy"


def _parse_yaml(text: str) -> tuple[Any, _Tree] | PolicyProblem:
    loader = yaml.SafeLoader(text)
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
            msg = f"{_where(loc[:-1])}: unknown field {_show(str(loc[-1]))}"
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
                    f"duplicate label id {_show(lid)} (first at line {first_label[lid][0]})",
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
            f"labels[{i}]: a second label with action none ({_show(lid)}; the first is "
            f"{_show(nones[0][1])}): exactly one label says nothing applies",
        )
    first_rule: dict[str, int] = {}
    for i, rule in _items(data, "rules"):
        rid = rule.get("id")
        if isinstance(rid, str):
            if rid in first_rule:
                line, col = tree.where(("rules", i, "id"))
                yield PolicyProblem(
                    line, col, f"duplicate rule id {_show(rid)} (first at line {first_rule[rid]})"
                )
            else:
                first_rule[rid] = tree.where(("rules", i, "id"))[0]
        target = rule.get("label")
        if isinstance(target, str) and labels and target not in first_label:
            line, col = tree.where(("rules", i, "label"))
            yield PolicyProblem(line, col, f"rules[{i}]: leads to unknown label {_show(target)}")


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


# ----------------------------------------------------------------------------------- ordering


def version_order(version: str) -> tuple[tuple[int, int, str], ...]:
    """A sort key of human versions: numbers by value (``9`` < ``10``), words by text."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part)
        for part in re.findall(r"\d+|[^\d]+", version)
    )


# ---------------------------------------------------------------------------------------- diff


@dataclass(frozen=True, slots=True)
class Change:
    """One difference between two policies: ``added``, ``removed`` or ``changed``."""

    kind: Literal["label", "rule", "policy"]
    item: str
    change: Literal["added", "removed", "changed"]
    fields: tuple[str, ...] = ()


def diff_policies(a: Policy, b: Policy) -> list[Change]:
    """Labels and rules added, removed or changed from ``a`` to ``b`` (and the policy's fields)."""
    out: list[Change] = []
    top = [f for f in ("id", "version", "instructions") if getattr(a.doc, f) != getattr(b.doc, f)]
    for what, old_items, new_items in (
        ("label order", a.doc.labels, b.doc.labels),
        ("rule order", a.doc.rules, b.doc.rules),
    ):
        # The order the model reads them in, of the items both have (adding one is no move).
        both = {x.id for x in old_items} & {x.id for x in new_items}
        if [x.id for x in old_items if x.id in both] != [x.id for x in new_items if x.id in both]:
            top.append(what)
    if top:
        out.append(Change("policy", a.doc.id, "changed", tuple(top)))
    for kind, old, new in (
        ("label", a.doc.labels, b.doc.labels),
        ("rule", a.doc.rules, b.doc.rules),
    ):
        olds = {x.id: x.model_dump(mode="json") for x in old}
        news = {x.id: x.model_dump(mode="json") for x in new}
        for item in news:
            if item not in olds:
                out.append(Change(kind, item, "added"))  # type: ignore[arg-type]
        for item, before in olds.items():
            after = news.get(item)
            if after is None:
                out.append(Change(kind, item, "removed"))  # type: ignore[arg-type]
            elif after != before:
                changed = tuple(f for f in after if after[f] != before.get(f))
                out.append(Change(kind, item, "changed", changed))  # type: ignore[arg-type]
    return out
