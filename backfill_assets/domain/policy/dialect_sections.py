"""How a model that does not read the policy's JSON contract is spoken to, and how its answer
maps onto the policy: the dialects and the policy file's ``dialects:`` section (pure)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from backfill_assets.domain.policy.items import Item, quoted

# How the model is spoken to (BACKFILL_MODEL_DIALECT): the policy's JSON contract over chat
# completions; OpenAI's moderation endpoint mapped through the policy's section; Llama Guard's
# safe/unsafe assessment over its categories; gpt-oss-safeguard reading the policy as its system
# message.
CHAT_JSON = "chat-json"
OPENAI_MODERATION = "openai-moderation"
LLAMA_GUARD = "llama-guard"
SAFEGUARD = "safeguard"
DIALECTS = (CHAT_JSON, OPENAI_MODERATION, LLAMA_GUARD, SAFEGUARD)
# Not a way of speaking to a model: the labels a cascade of stages decided (issue 49). Its key
# version names the stages, its mapping version their decide rules; nothing is sent in it.
CASCADE = "cascade"
# Llama Guard 3 and 4's built-in (MLCommons) hazard categories, S1..S14 (their model cards).
LLAMA_GUARD_CATEGORIES = (
    "Violent Crimes",
    "Non-Violent Crimes",
    "Sex Crimes",
    "Child Sexual Exploitation",
    "Defamation",
    "Specialized Advice",
    "Privacy",
    "Intellectual Property",
    "Indiscriminate Weapons",
    "Hate",
    "Suicide & Self-Harm",
    "Sexual Content",
    "Elections",
    "Code Interpreter Abuse",
)
GUARD_CODES = tuple(f"S{i}" for i in range(1, len(LLAMA_GUARD_CATEGORIES) + 1))
# omni-moderation-latest's categories (OpenAI's moderation API reference); text-moderation
# models answer a subset of them.
MODERATION_CATEGORIES = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)


class CategoryMap(Item):
    """Where one moderation category leads: a label, optionally one of its rules, and the score
    from which it applies."""

    label: str
    rule: str | None = None
    threshold: float = Field(ge=0.0, le=1.0)

    @field_validator("threshold", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        # YAML reads 1 as an integer; a boolean is not a threshold.
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value


class ModerationMap(Item):
    """``dialects: openai-moderation:``: the categories the policy reads, and where each leads."""

    categories: dict[str, CategoryMap] = Field(min_length=1, max_length=len(MODERATION_CATEGORIES))

    @field_validator("categories")
    @classmethod
    def _known(cls, value: dict[str, CategoryMap]) -> dict[str, CategoryMap]:
        unknown = [c for c in value if c not in MODERATION_CATEGORIES]
        if unknown:
            raise ValueError(
                f"unknown category {quoted(unknown[0])}: expected one of "
                + ", ".join(MODERATION_CATEGORIES)
            )
        return value


class GuardMap(Item):
    """``dialects: llama-guard:``: which rule each of Llama Guard's built-in categories
    (``S1``..``S14``) stands for. Without it, the policy's own rules are the categories."""

    categories: dict[str, str] = Field(min_length=1, max_length=len(GUARD_CODES))

    @field_validator("categories")
    @classmethod
    def _known(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = [c for c in value if c not in GUARD_CODES]
        if unknown:
            raise ValueError(
                f"unknown category {quoted(unknown[0])}: expected one of S1 to "
                f"S{len(GUARD_CODES)} (Llama Guard's built-in categories)"
            )
        return value


class Dialects(Item):
    """How the answers of models that do not speak the policy map onto it (docs/policies.md)."""

    openai_moderation: ModerationMap | None = Field(default=None, alias="openai-moderation")
    llama_guard: GuardMap | None = Field(default=None, alias="llama-guard")
