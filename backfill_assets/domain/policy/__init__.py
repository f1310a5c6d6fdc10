"""The moderation policy: its file, its prompt, the output gate, gold-set figures (pure).

The names the CLI uses are handed on here, so it imports the package, not its modules."""

from __future__ import annotations

from backfill_assets.domain.policy.dialect_sections import GUARD_CODES, LLAMA_GUARD_CATEGORIES
from backfill_assets.domain.policy.diff import diff_policies
from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.policy.evaluation import DEFAULT_TENANT, NO_LABEL
from backfill_assets.domain.policy.file import PolicyInvalid, load_policy
from backfill_assets.domain.policy.rubric import Rubric

__all__ = [
    "DEFAULT_TENANT",
    "GUARD_CODES",
    "LLAMA_GUARD_CATEGORIES",
    "NO_LABEL",
    "Policy",
    "PolicyInvalid",
    "Rubric",
    "diff_policies",
    "load_policy",
]
