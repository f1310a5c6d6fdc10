"""The drift check's configured baseline: ``live`` or a JSON distribution over the policy's
labels, and which configured labels the policy does not have (pure)."""

from __future__ import annotations

import json
from collections.abc import Sequence

LIVE_BASELINE = "live"


class BaselineError(ValueError):
    """A drift setting we cannot use (``Settings.from_env`` reports it as a ``SettingsError``)."""


def unknown_labels(names: str, labels: Sequence[str]) -> list[str]:
    """The comma-separated ``names`` that are not labels of the policy."""
    return [x.strip() for x in names.split(",") if x.strip() and x.strip() not in labels]


def parse_baseline(raw: str, labels: Sequence[str]) -> dict[str, float]:
    """Parse and normalise a JSON distribution over the policy's ``labels``."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        raise BaselineError(f"drift baseline is neither 'live' nor JSON: {raw[:60]!r}") from None
    if not isinstance(data, dict) or not data:
        raise BaselineError("drift baseline must be a JSON object of label shares")
    shares: dict[str, float] = {}
    for label, share in data.items():
        if label not in labels:
            raise BaselineError(f"drift baseline: {label!r} is not a label of the policy")
        if not isinstance(share, int | float) or share < 0:
            raise BaselineError(f"drift baseline: share of {label!r} must be a number >= 0")
        shares[label] = float(share)
    total = sum(shares.values())
    if total <= 0:
        raise BaselineError("drift baseline: shares sum to zero")
    return {k: v / total for k, v in shares.items()}
