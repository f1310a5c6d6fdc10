"""Reading a cascade file: its stages checked field by field, every problem with its line and
column, and the cascade checked against a policy (pure).

A cascade is an ordered list of model stages; a post an early (cheap) stage decides is not sent
to the later ones (``decide.py``). The file names each stage's dialect and model, never where it
sends nor with which key: those come from the environment, ``BACKFILL_MODEL_BASE_URL__<STAGE>``
and ``BACKFILL_MODEL_API_KEY__<STAGE>`` (``CascadeStage.env_suffix``). docs/cascade.md.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backfill_assets.domain.cascade.decide import WHENS, Decide
from backfill_assets.domain.policy.dialect_sections import DIALECTS, LLAMA_GUARD, SAFEGUARD
from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.domain.ranges import MAX_OUTPUT_TOKENS
from backfill_assets.domain.work.regions import API_KEY_VAR, BASE_URL_VAR
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

# Far above any real cascade, as for a policy; bounds the parse.
MAX_CASCADE_BYTES = 1 << 20
MAX_STAGES = 8
NAME_PATTERN = "^[a-z][a-z0-9_-]{0,30}$"
_NAME_RE = re.compile(NAME_PATTERN)
MAX_MODEL_CHARS = 200
# What each dialect sends unless the settings say otherwise (BACKFILL_LLAMA_GUARD_VERSION,
# BACKFILL_REASONING_EFFORT's defaults): the variant a stage is checked with.
DEFAULT_VARIANTS = {LLAMA_GUARD: "3", SAFEGUARD: "medium"}

_WHOLE = "the cascade"
_STAGE_FIELDS = ("name", "dialect", "model", "decide")
_DECIDE_FIELDS = ("when", "min_score")
# Where and how a stage sends: never in the file. The variable that holds each instead.
_FROM_ENVIRONMENT = {
    "base_url": BASE_URL_VAR,
    "url": BASE_URL_VAR,
    "endpoint": BASE_URL_VAR,
    "api_base": BASE_URL_VAR,
    "api_key": API_KEY_VAR,
    "key": API_KEY_VAR,
    "token": API_KEY_VAR,
    "secret": API_KEY_VAR,
}


@dataclass(frozen=True, slots=True)
class CascadeStage:
    """One stage: its name, how its model is spoken to, the model, and the posts it decides
    (None only on the last stage, which decides everything that reaches it)."""

    name: str
    dialect: str
    model: str
    decide: Decide | None
    line: int  # the line of the stage's ``- name:`` item

    @property
    def env_suffix(self) -> str:
        """The suffix of the stage's variables: upper case, ``-`` as ``_`` (``FIRST_PASS``)."""
        return _suffix(self.name)

    @property
    def base_url_var(self) -> str:
        """The variable the stage's endpoint comes from: ``BACKFILL_MODEL_BASE_URL__<STAGE>``."""
        return f"{BASE_URL_VAR}__{self.env_suffix}"

    @property
    def api_key_var(self) -> str:
        """The variable the stage's key comes from: ``BACKFILL_MODEL_API_KEY__<STAGE>``."""
        return f"{API_KEY_VAR}__{self.env_suffix}"


@dataclass(frozen=True, slots=True)
class Cascade:
    """The stages, in the order a post meets them."""

    stages: tuple[CascadeStage, ...]

    def routing_version(self) -> str:
        """16 hex characters of the sha256 of the decide rules (each stage's name, ``when``
        and ``min_score``): changes when a threshold does."""
        return _short(
            [
                [s.name, s.decide.when, repr(float(s.decide.min_score))]
                if s.decide is not None
                else [s.name, None, None]
                for s in self.stages
            ]
        )

    def stage_version(self) -> str:
        """16 hex characters of the sha256 of the stages' names, dialects and models, in order;
        not of the decide rules."""
        return _short([[s.name, s.dialect, s.model] for s in self.stages])


class CascadeInvalid(FileInvalid):
    """A cascade file with problems; ``problems`` lists every one of them."""

    what = "cascade"


def _suffix(name: str) -> str:
    return name.upper().replace("-", "_")


def _short(value: Any) -> str:
    canonical = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


# ------------------------------------------------------------------------------------ checking


class _Reader:
    """The checks of one file's values, each problem placed by the tree."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.problems = tree.problems
        # Each stage's variable suffix: the name that has it and the line of that name.
        self.suffixes: dict[str, tuple[str, int]] = {}

    def add(self, path: YamlPath, message: str, key: bool = False) -> None:
        line, col = self.tree.where(path, key)
        self.problems.append(FileProblem(line, col, message))

    def unknown(self, path: YamlPath, field: str, known: Sequence[str], suffix: str) -> None:
        where = describe(path, _WHOLE)
        var = _FROM_ENVIRONMENT.get(field.lower().replace("-", "_"))
        if var is not None:
            what = "endpoint" if var == BASE_URL_VAR else "key"
            message = (
                f"{where}: {quoted(field)} is not written in a cascade file: a stage's {what} "
                f"comes from the environment, {var}__{suffix}"
            )
        else:
            message = f"{where}: unknown field {quoted(field)} (expected {', '.join(known)})"
        self.add((*path, field), message, key=True)

    def stages(self, data: Any) -> list[Any]:
        """The items of ``stages:``, after the checks of the top level."""
        if not isinstance(data, dict):
            self.add((), "a cascade is a mapping with one field, stages (docs/cascade.md)")
            return []
        for field in data:
            if field != "stages":
                self.unknown((), field, ["stages"], "<STAGE>")
        if "stages" not in data:
            self.add((), "missing field 'stages' (a list of 1 to 8 stages)")
            return []
        items = data["stages"]
        if not isinstance(items, list) or not items:
            self.add(("stages",), f"stages: must be a list of 1 to {MAX_STAGES} stages")
            return []
        if len(items) > MAX_STAGES:
            self.add(
                ("stages", MAX_STAGES),
                f"stages: {len(items)} stages, more than {MAX_STAGES}",
            )
        return items

    def stage(self, i: int, raw: Any, last: bool) -> CascadeStage | None:
        path: YamlPath = ("stages", i)
        if not isinstance(raw, dict):
            self.add(path, f"stages[{i}]: a stage is a mapping of {', '.join(_STAGE_FIELDS)}")
            return None
        name = self.name(raw, path)
        for field in raw:
            if field not in _STAGE_FIELDS:
                self.unknown(path, field, _STAGE_FIELDS, _suffix(name) if name else "<STAGE>")
        dialect = self.text(raw, path, "dialect")
        if dialect is not None and dialect not in DIALECTS:
            self.add(
                (*path, "dialect"),
                f"stages[{i}].dialect: {quoted(dialect)}: expected one of {', '.join(DIALECTS)}",
            )
            dialect = None
        model = self.model(raw, path)
        decide = self.decide(raw, path, last)
        if name is None or dialect is None or model is None or (decide is None and not last):
            return None
        return CascadeStage(name, dialect, model, decide, self.tree.where(path)[0])

    def text(self, raw: dict[str, Any], path: YamlPath, field: str) -> str | None:
        """The text of ``raw[field]``, or None after saying why there is none."""
        where = describe(path, _WHOLE)
        if field not in raw:
            self.add(path, f"{where}: missing field {quoted(field)}")
            return None
        value = raw[field]
        if (*path, field) in self.tree.unreadable:
            return None
        if not isinstance(value, str):
            self.add((*path, field), f"{where}.{field}: must be text")
            return None
        return value

    def name(self, raw: dict[str, Any], path: YamlPath) -> str | None:
        name = self.text(raw, path, "name")
        if name is None:
            return None
        where = f"{describe(path, _WHOLE)}.name"
        if not _NAME_RE.fullmatch(name):
            self.add((*path, "name"), f"{where}: {quoted(name)} must match {NAME_PATTERN}")
            return None
        line = self.tree.where((*path, "name"))[0]
        suffix = _suffix(name)
        if suffix not in self.suffixes:
            self.suffixes[suffix] = (name, line)
            return name
        first, first_line = self.suffixes[suffix]
        if first == name:
            message = f"{where}: duplicate stage name {quoted(name)} (first at line {first_line})"
        else:
            message = (
                f"{where}: {quoted(name)} and {quoted(first)} (line {first_line}) would read the "
                f"same variables, {BASE_URL_VAR}__{suffix} and {API_KEY_VAR}__{suffix}: rename one"
            )
        self.add((*path, "name"), message)
        return None

    def model(self, raw: dict[str, Any], path: YamlPath) -> str | None:
        model = self.text(raw, path, "model")
        if model is None:
            return None
        where = f"{describe(path, _WHOLE)}.model"
        if not model:
            problem = "must not be empty"
        elif len(model) > MAX_MODEL_CHARS:
            problem = f"longer than {MAX_MODEL_CHARS} characters"
        elif any(c.isspace() or not c.isprintable() for c in model):
            problem = f"{quoted(model)} holds whitespace or a control character"
        else:
            return model
        self.add((*path, "model"), f"{where}: {problem}")
        return None

    def decide(self, raw: dict[str, Any], path: YamlPath, last: bool) -> Decide | None:
        where = f"{describe(path, _WHOLE)}.decide"
        if last:
            if "decide" in raw:
                self.add(
                    (*path, "decide"),
                    f"{where}: the last stage decides everything that reaches it (remove decide)",
                    key=True,
                )
            return None
        if "decide" not in raw:
            self.add(
                path,
                f"{describe(path, _WHOLE)}: missing field 'decide' (every stage but the last "
                "says which posts it decides: when none_label or any_label, and min_score)",
            )
            return None
        rule, rule_path = raw["decide"], (*path, "decide")
        if not isinstance(rule, dict):
            self.add(rule_path, f"{where}: must be a mapping of when and min_score")
            return None
        for field in rule:
            if field not in _DECIDE_FIELDS:
                self.unknown(rule_path, field, _DECIDE_FIELDS, "<STAGE>")
        when = self.text(rule, rule_path, "when")
        if when is not None and when not in WHENS:
            self.add(
                (*rule_path, "when"),
                f"{where}.when: {quoted(when)}: expected one of {', '.join(WHENS)}",
            )
            when = None
        score = self.score(rule, rule_path)
        return None if when is None or score is None else Decide(when, score)

    def score(self, rule: dict[str, Any], path: YamlPath) -> float | None:
        where = f"{describe(path, _WHOLE)}.min_score"
        if "min_score" not in rule:
            self.add(path, f"{describe(path, _WHOLE)}: missing field 'min_score'")
            return None
        value = rule["min_score"]
        if (*path, "min_score") in self.tree.unreadable:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            shown = str(value).lower() if isinstance(value, bool) else quoted(str(value))
            self.add((*path, "min_score"), f"{where}: {shown} is not a number from 0 to 1")
            return None
        if not 0 <= value <= 1:
            self.add((*path, "min_score"), f"{where}: {value!r} is not from 0 to 1")
            return None
        return float(value)


def parse_cascade(text: str, source: str = "<cascade>") -> Cascade:
    """Check a cascade's YAML text; ``CascadeInvalid`` lists every problem with line and column."""
    if (big := too_large(text, MAX_CASCADE_BYTES)) is not None:
        raise CascadeInvalid(source, [big])
    parsed = parse_yaml(
        text, _WHOLE, "the file is empty: a cascade is a mapping with stages (docs/cascade.md)"
    )
    if isinstance(parsed, FileProblem):
        raise CascadeInvalid(source, [parsed])
    data, tree = parsed
    reader = _Reader(tree)
    items = reader.stages(data)
    stages = [reader.stage(i, raw, i == len(items) - 1) for i, raw in enumerate(items)]
    if reader.problems:
        raise CascadeInvalid(source, sorted(reader.problems, key=lambda p: (p.line, p.column)))
    return Cascade(tuple(s for s in stages if s is not None))


def load_cascade(path: str | Path) -> Cascade:
    """Read and check a cascade file (``CascadeInvalid`` when it cannot be used)."""
    text = read_text(path, MAX_CASCADE_BYTES)
    if isinstance(text, FileProblem):
        raise CascadeInvalid(str(path), [text])
    return parse_cascade(text, str(path))


def cascade_yaml(cascade: Cascade, header: Sequence[str] = ()) -> str:
    """The cascade as a file ``load_cascade`` reads back to the same stages and rules (its
    ``routing_version`` and ``stage_version`` unchanged): every text double-quoted, so no name or
    model is read as a number or a boolean, and each ``min_score`` as Python writes the float,
    which YAML reads back to the same number. ``header``: comment lines above it."""
    # A comment ends at a line end: one in a header line (a file's name) would start YAML.
    lines = ["# " + "".join(c if c.isprintable() else "?" for c in line) for line in header]
    lines.append("stages:")
    for stage in cascade.stages:
        lines += [
            f"  - name: {_text(stage.name)}",
            f"    dialect: {_text(stage.dialect)}",
            f"    model: {_text(stage.model)}",
        ]
        if stage.decide is not None:
            rule = stage.decide
            lines.append(f"    decide: {{when: {rule.when}, min_score: {float(rule.min_score)!r}}}")
    return "\n".join(lines) + "\n"


def _text(value: str) -> str:
    """A YAML double-quoted scalar: JSON's escapes are YAML's."""
    return json.dumps(value, ensure_ascii=False)


def cascade_problems(cascade: Cascade, policy: Policy) -> list[FileProblem]:
    """What stops ``policy`` from being read in each stage's dialect (its default variant), at
    that stage's line: ``openai-moderation`` needs the policy's ``dialects: openai-moderation:``
    section, ``llama-guard`` its rules. Empty when every stage can use it."""
    problems = []
    for stage in cascade.stages:
        variant = DEFAULT_VARIANTS.get(stage.dialect, "")
        try:
            Rubric(policy, stage.dialect, variant, MAX_OUTPUT_TOKENS)
        except ValueError as exc:
            problems.append(
                FileProblem(stage.line, 1, f"stage {quoted(stage.name)} ({stage.dialect}): {exc}")
            )
    return problems
