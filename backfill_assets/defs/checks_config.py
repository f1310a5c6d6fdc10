"""What the operator trusts: bounds of the partition checks and where applied labels go.

(Not the moderation policy, which is the user's labels and rules: ``domain/policy/document.py``.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import dagster as dg
from pydantic import Field

from backfill_assets.domain.checks.rules import CheckBounds, DriftRule
from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.ranges import MAX_TOKENS

LIVE_BASELINE = "live"


class ChecksConfigError(ValueError):
    """A check setting we cannot use (``Settings.from_env`` reports it as a ``SettingsError``)."""


class ChecksResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Check bounds, the drift baseline and the apply target."""

    # The descriptions are the reference: docs/configuration.md is generated from them.
    max_rebilled_share: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description="`spend`: rebilled tokens allowed, as a share of the partition's billed "
        "tokens.",
    )
    max_orphan_attempts: int = Field(
        default=16,
        ge=0,
        le=10**9,
        description="`spend`: attempts with no usage/error booked (the crash window).",
    )
    max_tokens_per_key: int = Field(
        default=0,
        ge=0,
        le=MAX_TOKENS,
        description="`spend`: billed tokens per expected key (0: no bound).",
    )
    max_over_bound_calls: int = Field(
        default=0,
        ge=0,
        le=10**9,
        description="`billed_within_bound` (blocking): calls billed past the bound reserved "
        "for them a partition may hold and still have its labels applied. Raise it only after "
        "looking at the provider's bill.",
    )
    drift_baseline: str = Field(
        default=LIVE_BASELINE,
        description="`label_drift` baseline: `live` (label shares in the posts' live "
        "`moderation_label` column, excluding labels this rubric wrote) or a JSON object of "
        'shares over the policy\'s labels, e.g. `{"ok": 0.8, "spam": 0.1, "abuse": 0.05}`.',
    )
    drift_labels: str = Field(
        default="",
        description="Labels watched for drift, comma-separated; each must be a label of the "
        "policy. Empty: the policy's labels whose action is not `none`.",
    )
    drift_factor: float = Field(
        default=5.0,
        gt=1.0,
        le=1000.0,
        description="A watched label warns when its share reaches this x the baseline.",
    )
    drift_min_count: int = Field(
        default=5, ge=1, le=10**9, description="... and it was seen at least this many times."
    )
    apply_live: bool = Field(
        default=False,
        description="Off: `applied_labels` writes the shadow columns only; on also writes the "
        "live `moderation_label` columns.",
    )

    def bounds(self, policy: Policy) -> CheckBounds:
        """The pure checks' bounds; drift watches ``policy``'s flagging labels by default."""
        watched = tuple(x.strip() for x in self.drift_labels.split(",") if x.strip())
        return CheckBounds(
            max_rebilled_share=self.max_rebilled_share,
            max_orphan_attempts=self.max_orphan_attempts,
            max_tokens_per_key=self.max_tokens_per_key,
            max_over_bound_calls=self.max_over_bound_calls,
            drift=DriftRule(
                labels=watched or policy.flagging_labels,
                factor=self.drift_factor,
                min_count=self.drift_min_count,
            ),
        )

    def configured_baseline(self, policy: Policy) -> dict[str, float] | None:
        """A configured distribution, or None when the live moderation is the baseline."""
        if self.drift_baseline.strip() == LIVE_BASELINE:
            return None
        return parse_baseline(self.drift_baseline, policy.label_ids)


def unknown_labels(names: str, labels: Sequence[str]) -> list[str]:
    """The comma-separated ``names`` that are not labels of the policy."""
    return [x.strip() for x in names.split(",") if x.strip() and x.strip() not in labels]


def parse_baseline(raw: str, labels: Sequence[str]) -> dict[str, float]:
    """Parse and normalise a JSON distribution over the policy's ``labels``."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        raise ChecksConfigError(
            f"drift baseline is neither 'live' nor JSON: {raw[:60]!r}"
        ) from None
    if not isinstance(data, dict) or not data:
        raise ChecksConfigError("drift baseline must be a JSON object of label shares")
    shares: dict[str, float] = {}
    for label, share in data.items():
        if label not in labels:
            raise ChecksConfigError(f"drift baseline: {label!r} is not a label of the policy")
        if not isinstance(share, int | float) or share < 0:
            raise ChecksConfigError(f"drift baseline: share of {label!r} must be a number >= 0")
        shares[label] = float(share)
    total = sum(shares.values())
    if total <= 0:
        raise ChecksConfigError("drift baseline: shares sum to zero")
    return {k: v / total for k, v in shares.items()}
