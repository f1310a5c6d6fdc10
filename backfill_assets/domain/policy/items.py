"""The base of every item of a policy file (pure). How a user's value is quoted in a message,
``quoted``, is handed on from ``domain/yaml_positions.py``, shared by every checked file."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from backfill_assets.domain.yaml_positions import quoted as quoted  # handed on


class Item(BaseModel):
    """A part of a policy file: unknown fields are errors, values are never coerced."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
