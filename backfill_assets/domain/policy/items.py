"""The base of every item of a policy file, and how a user's value is quoted in a message
(pure)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

_SHOWN = 40


class Item(BaseModel):
    """A part of a policy file: unknown fields are errors, values are never coerced."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def quoted(value: str) -> str:
    """A user's value in a message: quoted, and cut short."""
    return repr(value[:_SHOWN] + ("..." if len(value) > _SHOWN else ""))
