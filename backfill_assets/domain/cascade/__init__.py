"""A cascade of model stages: its file, checked with every problem's line, which posts each
stage decides, and the sweep of its thresholds over a gold set (``sweep.py``) (pure).
docs/cascade.md.

The names the settings and the CLI use are handed on here, so they import the package, not its
modules."""

from __future__ import annotations

from backfill_assets.domain.cascade.decide import (
    ANY_LABEL,
    NONE_LABEL,
    WHENS,
    Decide,
    decides,
    stage_score,
)
from backfill_assets.domain.cascade.file import (
    MAX_STAGES,
    Cascade,
    CascadeInvalid,
    CascadeStage,
    cascade_problems,
    cascade_yaml,
    load_cascade,
    parse_cascade,
)
from backfill_assets.domain.yaml_positions import FileProblem

__all__ = [
    "ANY_LABEL",
    "MAX_STAGES",
    "NONE_LABEL",
    "WHENS",
    "Cascade",
    "CascadeInvalid",
    "CascadeStage",
    "Decide",
    "FileProblem",
    "cascade_problems",
    "cascade_yaml",
    "decides",
    "load_cascade",
    "parse_cascade",
    "stage_score",
]
