"""The assets' and check groups' names, spelled once: the definitions, the run planner, the
launcher and the CLI all refer to these."""

from __future__ import annotations

import dagster as dg

from backfill_assets.domain.checks.catalog import CHECK_GROUPS

POSTS = dg.AssetKey("posts")
LABELS = dg.AssetKey("moderation_labels")
APPLIED = dg.AssetKey("applied_labels")
POLICY_EVALUATION = dg.AssetKey("policy_evaluation")
# The check groups whose failures gate the apply, and their keys on the labels asset.
BLOCKING_GROUPS = tuple(g.name for g in CHECK_GROUPS if g.blocking)
BLOCKING_CHECK_KEYS = tuple(dg.AssetCheckKey(LABELS, name) for name in BLOCKING_GROUPS)
CHECK_KEYS = tuple(dg.AssetCheckKey(LABELS, g.name) for g in CHECK_GROUPS)
