"""The moderation policy: the user's labels, rules and instructions, and its identity.

A policy is data, not code: ``BACKFILL_POLICY_PATH`` names the file (read and checked by
``policy_file.py``), and ``Policy`` gives its identity: its id, its human version and a hash of
its canonical content (comments and key order do not count; every word does). That identity
names the work: it is part of every key and of the labels asset's code version.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator

from backfill_assets.domain.policy.dialect_sections import (
    CASCADE,
    CHAT_JSON,
    DIALECTS,
    LLAMA_GUARD,
    OPENAI_MODERATION,
    Dialects,
    GuardMap,
    ModerationMap,
)
from backfill_assets.domain.policy.items import Item, quoted
from backfill_assets.domain.work.keys import TENANT_ID_RE

# Rule and label ids: short, stable, and safe anywhere (keys, SQL, CSV, a comma-joined list).
ITEM_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$")
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,39}$")
# A dialect's variant at the end of a key version (``+llama-guard@3``): short, no separators.
VARIANT_RE = re.compile(r"^[a-z0-9]{0,16}$")
# The variant of Llama Guard asked through its own chat template (the built-in categories).
BUILTIN_TEMPLATE = "builtin"
ACTIONS = ("none", "review", "hide")
# A label's numeric severity: a rank the platform reads, not an amount.
MAX_SEVERITY = 1_000_000
Action = Literal["none", "review", "hide"]
# Far above any real policy; bounds a text field (and the prompt every call pays for).
_MAX_TEXT = 100_000

# The built-in policy, exactly as shipped, keys its work with the prompt version today's
# results were stored under before policies were files (the sha256 of that prompt), so an
# upgraded store re-pays nothing. Any other content, an edited copy included, keys by its own
# identity. A test pins both halves (docs/policies.md, "Upgrading").
BUILTIN_CONTENT_HASH = "f26961e0a5c1f71ec62d4c573faf1c0eb24819bd7b9ce052d6c3584ad3e55431"
LEGACY_KEY_VERSIONS: Mapping[str, str] = {BUILTIN_CONTENT_HASH: "policy@d0f22620582d"}


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("empty")
    if len(value) > _MAX_TEXT:
        raise ValueError(f"longer than {_MAX_TEXT} characters")
    if "\x00" in value:
        raise ValueError("contains NUL characters")
    return value


class Examples(Item):
    """Posts that break a rule and posts that do not, for the model to read."""

    violates: list[str] = Field(default_factory=list, max_length=100)
    safe: list[str] = Field(default_factory=list, max_length=100)

    @field_validator("violates", "safe")
    @classmethod
    def _texts(cls, value: list[str]) -> list[str]:
        return [_text(v) for v in value]


class LabelDef(Item):
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
            raise ValueError(f"severity {quoted(value)} must match {VERSION_RE.pattern}")
        if isinstance(value, int) and not -MAX_SEVERITY <= value <= MAX_SEVERITY:
            raise ValueError(f"severity must be within -{MAX_SEVERITY:,} and {MAX_SEVERITY:,}")
        return value


class RuleDef(Item):
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


class PolicyDoc(Item):
    """The policy file's content, validated (``extra="forbid"``: an unknown field is an error)."""

    id: str
    version: str
    instructions: str
    labels: list[LabelDef] = Field(max_length=256)
    rules: list[RuleDef] = Field(default_factory=list, max_length=1024)
    # Not part of the content hash: a chat model is sent the policy, never this section, so
    # editing it changes no chat key. A dialect's key carries its own section (key_version).
    dialects: Dialects | None = None

    @field_validator("id")
    @classmethod
    def _policy_id(cls, value: str) -> str:
        if not TENANT_ID_RE.fullmatch(value):
            raise ValueError(f"bad id {quoted(value)}: must match {TENANT_ID_RE.pattern}")
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> Any:
        # YAML reads 5 as an integer; 5.10 would be the float 5.1, so floats are refused.
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if isinstance(value, str) and not VERSION_RE.fullmatch(value):
            raise ValueError(f"bad version {quoted(value)}: must match {VERSION_RE.pattern}")
        if not isinstance(value, str):
            raise ValueError('version must be text such as "5" (quote it)')
        return value

    @field_validator("instructions")
    @classmethod
    def _instructions(cls, value: str) -> str:
        return _text(value)


def _item_id(value: str) -> str:
    if not ITEM_ID_RE.fullmatch(value):
        raise ValueError(f"bad id {quoted(value)}: must match {ITEM_ID_RE.pattern}")
    return value


class Policy:
    """A checked policy, the dialect its model is spoken to in, and its identity.

    ``content_hash``: sha256 of the canonical JSON of the content (every field but
    ``dialects``, key order and comments aside). ``identity``: ``<id>@<version>#<hash[:16]>``.
    ``key_version``: what keys, the applied labels and the code version carry: the identity
    (the built-in policy as shipped keeps its legacy one), and in another dialect than
    ``chat-json`` the dialect's name and its variant (what else is sent: Llama Guard's prompt
    format, or ``builtin`` for its own chat template; safeguard's reasoning effort):
    ``<key>+<dialect>[@<variant>]``. The dialect's
    section is not sent, so it names no work: ``mapping_version`` says which section a stored
    answer was read under, and a changed one re-labels stored answers without a call.
    """

    __slots__ = ("_key_version", "_mapping_version", "content_hash", "dialect", "doc", "variant")

    def __init__(
        self, doc: PolicyDoc, dialect: str = CHAT_JSON, variant: str = "", routing: str = ""
    ) -> None:
        if dialect not in DIALECTS and dialect != CASCADE:
            raise ValueError(f"dialect {dialect!r}: expected one of {', '.join(DIALECTS)}")
        if dialect == OPENAI_MODERATION and (
            doc.dialects is None or doc.dialects.openai_moderation is None
        ):
            raise ValueError(
                f"policy {doc.id}@{doc.version} has no dialects: openai-moderation: section "
                "(which label each category leads to: docs/policies.md)"
            )
        if dialect == LLAMA_GUARD and not doc.rules:
            raise ValueError(
                f"policy {doc.id}@{doc.version} has no rules: Llama Guard judges a post against "
                "categories, which are the policy's rules (docs/policies.md)"
            )
        if not VARIANT_RE.fullmatch(variant):
            raise ValueError(f"variant {variant!r}: must match {VARIANT_RE.pattern}")
        self.doc = doc
        self.dialect = dialect
        self.variant = variant if dialect != CHAT_JSON else ""
        self.content_hash = hashlib.sha256(canonical_json(doc).encode("utf-8")).hexdigest()
        # Read per result row (the writer's contract lookup): worked out once.
        self._key_version = self._work_key_version()
        section = dialect_json(doc, dialect) if dialect not in (CHAT_JSON, CASCADE) else ""
        self._mapping_version = (
            hashlib.sha256(section.encode("utf-8")).hexdigest()[:16] if section else routing
        )

    def in_cascade(self, stages: str, routing: str) -> Policy:
        """The policy of a cascade's labels: ``stages`` (a hash of what each stage sends) is its
        variant, so in its key version; ``routing`` (a hash of the decide rules) its mapping
        version, so a changed threshold re-routes stored answers without a call."""
        return Policy(self.doc, CASCADE, stages, routing)

    def in_dialect(self, dialect: str, variant: str = "") -> Policy:
        """The same policy, spoken in ``dialect`` (``ValueError``: it has no section for it)."""
        if dialect == self.dialect and variant == self.variant:
            return self
        return Policy(self.doc, dialect, variant)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Policy)
            and other.content_hash == self.content_hash
            and other.key_version == self.key_version
            and other.mapping_version == self.mapping_version
        )

    def __hash__(self) -> int:
        return hash((self.content_hash, self.key_version, self.mapping_version))

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
        """The policy's part of every key and of the code version, in its dialect."""
        return self._key_version

    def _work_key_version(self) -> str:
        base = LEGACY_KEY_VERSIONS.get(self.content_hash, self.identity)
        if self.dialect == CHAT_JSON:
            return base
        variant = self.variant
        if self.dialect == LLAMA_GUARD and self.guard_map is not None:
            # Sent alone to the model's own chat template: no prompt format of ours is sent,
            # and the post alone is other work than the policy's rules rendered as categories.
            variant = BUILTIN_TEMPLATE
        return f"{base}+{self.dialect}" + (f"@{variant}" if variant else "")

    @property
    def mapping_version(self) -> str:
        """How a stored answer is read onto the policy, where that is not sent to the model:
        the hash of the dialect's section ('' when there is none, or in chat-json). Not part
        of the keys (a changed threshold re-labels stored answers without a call); part of
        the code version."""
        return self._mapping_version

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
    def moderation_map(self) -> ModerationMap | None:
        """The ``dialects: openai-moderation:`` section, if the policy has one."""
        return self.doc.dialects.openai_moderation if self.doc.dialects else None

    @property
    def guard_map(self) -> GuardMap | None:
        """The ``dialects: llama-guard:`` section, if the policy has one."""
        return self.doc.dialects.llama_guard if self.doc.dialects else None

    @property
    def rule_labels(self) -> tuple[tuple[str, str], ...]:
        """(rule id, the label it leads to), in the file's order."""
        return tuple((rule.id, rule.label) for rule in self.doc.rules)


def canonical_json(doc: PolicyDoc) -> str:
    """The content as sorted, compact JSON: the same policy gives the same text. The
    ``dialects`` section is not part of it (``dialect_json``)."""
    return json.dumps(
        doc.model_dump(mode="json", exclude={"dialects"}),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )


def full_json(doc: PolicyDoc) -> str:
    """The whole content, ``dialects`` included (its YAML names), as sorted, compact JSON."""
    return json.dumps(
        doc.model_dump(mode="json", by_alias=True),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )


def dialect_json(doc: PolicyDoc, dialect: str) -> str:
    """One dialect's section as sorted, compact JSON ('' when the policy has none)."""
    section = (
        doc.dialects.model_dump(mode="json", by_alias=True).get(dialect) if doc.dialects else None
    )
    if section is None:
        return ""
    return json.dumps(section, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
