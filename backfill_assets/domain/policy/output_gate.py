"""The output gate: an answer is parsed strictly and held to the policy's contract before it is
trusted (pure).

``parse_output`` reads the JSON (no duplicate keys, bounded numbers and size), validates it
as ``ModerationOutput``, and ``OutputContract`` checks the label and rule ids against the
policy; anything else is ``OutputRejected``, never stored.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from backfill_assets.domain.policy.document import Policy

SCHEMA_VERSION = 1
# A rule id list longer than this is no answer a model means (a policy has at most 1,024).
_MAX_RULE_IDS = 1024


class ModerationOutput(BaseModel):
    """The shape of an answer for one post; ``OutputContract.check`` then holds it to the
    policy (its labels and rules). Anything else is ``schema_rejected``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    schema_version: Literal[1] = Field(description="Output contract version.")
    correlation_id: str = Field(description="The key the request was sent with, echoed.")
    label: str = Field(description="One label of the policy.")
    rule_ids: tuple[str, ...] = Field(
        max_length=_MAX_RULE_IDS, description="The policy's rules that matched, of that label."
    )
    confidence: float = Field(ge=0.0, le=1.0, description="Model confidence in [0, 1].")

    @field_validator("rule_ids", mode="before")
    @classmethod
    def _json_array(cls, value: Any) -> Any:
        # JSON has arrays, not tuples: strict mode would refuse every list.
        return tuple(value) if isinstance(value, list) else value

    @field_validator("schema_version", "confidence", mode="before")
    @classmethod
    def _json_number(cls, value: Any, info: ValidationInfo) -> Any:
        # bool is an int subclass: without this, ``true`` passes as 1 and 1.0.
        if isinstance(value, bool):
            raise ValueError("a boolean is not a number")
        if info.field_name == "confidence" and isinstance(value, int):
            # JSON has one number type; 1 and 1.0 are the same confidence. A huge integer
            # must fail validation, not raise OverflowError past the gate.
            if abs(value) > 1:
                raise ValueError("confidence out of range")
            return float(value)
        return value

    @field_validator("confidence")
    @classmethod
    def _no_negative_zero(cls, value: float) -> float:
        return value + 0.0  # -0.0 -> 0.0


class OutputRejected(ValueError):
    """The raw model answer failed the output contract; the reason never holds post text."""


# Far above any answer the contract allows (~150 bytes); bounds parse time and nesting.
MAX_ANSWER_CHARS = 4096
# A number literal longer than this is no confidence a model means (and 4,300+ digit
# integers raise ValueError inside ``int``).
MAX_NUMBER_CHARS = 40
_FIELDS = frozenset(ModerationOutput.model_fields)


def _parse_int(literal: str) -> int:
    if len(literal) > MAX_NUMBER_CHARS:
        raise OutputRejected("malformed JSON: number too long")
    return int(literal)


def _parse_float(literal: str) -> float:
    if len(literal) > MAX_NUMBER_CHARS:
        raise OutputRejected("malformed JSON: number too long")
    value = float(literal)
    if not math.isfinite(value):
        raise OutputRejected("malformed JSON: number out of range")
    return value


def _parse_constant(name: str) -> Any:
    raise OutputRejected(f"malformed JSON: {name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        # Parsers disagree on which duplicate wins; an ambiguous answer is no answer.
        raise OutputRejected("malformed JSON: duplicate key")
    return out


# One decoder for every answer (``json.loads`` with hooks builds a new one per call).
_DECODER = json.JSONDecoder(
    parse_int=_parse_int,
    parse_float=_parse_float,
    parse_constant=_parse_constant,
    object_pairs_hook=_unique_keys,
)


def _loads(raw: str) -> Any:
    if not isinstance(raw, str):
        raise OutputRejected(f"answer is {type(raw).__name__}, not text")
    if len(raw) > MAX_ANSWER_CHARS:
        raise OutputRejected(f"answer longer than {MAX_ANSWER_CHARS} characters")
    if raw.startswith("\ufeff"):
        raise OutputRejected("malformed JSON: JSONDecodeError")  # as json.loads refuses a BOM
    try:
        return _DECODER.decode(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        if isinstance(exc, OutputRejected):
            raise
        raise OutputRejected(f"malformed JSON: {type(exc).__name__}") from None


def _where(loc: tuple[int | str, ...]) -> str:
    # Locations name the model's own keys: print only ours, so a model that echoes the post
    # as a key cannot put its text into a dead letter.
    parts = [str(p) if p in _FIELDS else "<other>" for p in loc]
    return ".".join(parts) or "root"


@dataclass(frozen=True)
class OutputContract:
    """What an answer must be under one policy: its labels, its rules and the label each rule
    leads to. The JSON schema sent as ``response_format`` and the checks of every answer and
    every result frame are built from it."""

    labels: tuple[str, ...]
    none_label: str
    # (rule id, label), in the policy's order.
    rules: tuple[tuple[str, str], ...] = ()
    _rule_label: dict[str, str] = field(init=False, repr=False, compare=False, hash=False)
    _ruled: frozenset[str] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_rule_label", dict(self.rules))
        object.__setattr__(self, "_ruled", frozenset(label for _r, label in self.rules))

    @classmethod
    def of(cls, policy: Policy) -> OutputContract:
        """The contract of a policy."""
        return cls(policy.label_ids, policy.none_label, policy.rule_labels)

    def rules_of(self, label: str) -> tuple[str, ...]:
        """The rules that lead to ``label``, in the policy's order."""
        return tuple(r for r, lb in self.rules if lb == label)

    def rule_label(self, rule_id: str) -> str | None:
        """The label a rule leads to (None: not a rule of the policy)."""
        return self._rule_label.get(rule_id)

    def problem(self, label: str, rule_ids: Sequence[str]) -> str | None:
        """Why a (label, rule ids) pair breaks the contract, or None. The reason never repeats
        what the model wrote: a label or rule id it made up could carry post text."""
        if label not in self.labels:
            return "label not in the policy"
        if len(set(rule_ids)) != len(rule_ids):
            return "rule_ids repeats a rule"
        for rule_id in rule_ids:
            led_to = self._rule_label.get(rule_id)
            if led_to is None:
                return "rule_ids names a rule not in the policy"
            if led_to != label:
                return "rule_ids names a rule of another label"
        if not rule_ids and label != self.none_label and label in self._ruled:
            return "rule_ids is empty for a label that has rules"
        return None

    def json_schema(self) -> dict[str, Any]:
        """Strict JSON schema for ``response_format``: the closed label set, the policy's rule
        ids, bounded confidence. Which rule leads to which label (and the label that means
        nothing applies) is in the descriptions, in the form ``contract_from_schema`` reads."""
        ids = [r for r, _lb in self.rules]
        if ids:
            pairs = ", ".join(f"{r} -> {lb}" for r, lb in self.rules)
            rule_doc = (
                f"Ids of the rules the post breaks, each leading to the label chosen: {pairs}; "
                f'empty only when the label is "{self.none_label}" or has no rules.'
            )
            items: dict[str, Any] = {"type": "string", "enum": ids}
        else:
            rule_doc = "Always empty: this policy has no rules."
            items = {"type": "string"}
        return {
            "type": "object",
            "additionalProperties": False,
            "required": ["schema_version", "correlation_id", "label", "rule_ids", "confidence"],
            "properties": {
                "schema_version": {"type": "integer", "enum": [SCHEMA_VERSION]},
                "correlation_id": {"type": "string"},
                "label": {
                    "type": "string",
                    "enum": list(self.labels),
                    "description": f'Exactly one label; "{self.none_label}" when nothing applies.',
                },
                "rule_ids": {"type": "array", "items": items, "description": rule_doc},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            },
        }


# <post>, </post>, </POST>, < / post >, <post\n> ...: the prompt's delimiter in any disguise.
_PAIR = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,31}) -> ([A-Za-z0-9][A-Za-z0-9._-]{0,31})")
_NONE = re.compile(r'"([A-Za-z0-9][A-Za-z0-9._-]{0,31})" when nothing applies')


def contract_from_schema(schema: Any) -> OutputContract | None:
    """The contract a ``response_format`` schema of ours describes (None: not one of ours).

    For whoever only sees the wire (the provider simulator): labels from the enum, rules and
    their labels from the descriptions ``json_schema`` writes.
    """
    try:
        props = schema["properties"]
        labels = tuple(str(x) for x in props["label"]["enum"])
        found = _NONE.search(str(props["label"].get("description", "")))
        rule_doc = str(props["rule_ids"].get("description", ""))
        enum = props["rule_ids"]["items"].get("enum", [])
    except (KeyError, TypeError, AttributeError):
        return None
    if not labels:
        return None
    none_label = found[1] if found and found[1] in labels else labels[0]
    rule_ids = {str(r) for r in enum}
    pairs = tuple((r, lb) for r, lb in _PAIR.findall(rule_doc) if r in rule_ids and lb in labels)
    return OutputContract(labels, none_label, pairs)


def parse_output(raw: str, sent_key: str, contract: OutputContract) -> ModerationOutput:
    """Parse and validate a raw model answer bound to the key it was sent with.

    The output gate: whatever ``raw`` holds, this returns a ``ModerationOutput`` that meets the
    policy's contract or raises ``OutputRejected``, never another exception.
    """
    data = _loads(raw)
    try:
        out = ModerationOutput.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{_where(err['loc'])}: {err['type']}" for err in exc.errors()[:4])
        raise OutputRejected(f"output schema: {problems}") from None
    if out.correlation_id != sent_key:
        raise OutputRejected("correlation id does not match the key sent")
    why = contract.problem(out.label, out.rule_ids)
    if why is not None:
        raise OutputRejected(f"output contract: {why}")
    return out
