"""Frame-level validation of results before they are committed (pandera).

The schemas live in ``_frames``, imported on the first call: pandas and pandera are about a
fifth of the CLI's start-up, and a no-op ``run``, ``dry-run`` or ``usage`` never validates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from backfill_assets.domain.policy.output_gate import OutputContract
from backfill_assets.domain.work.keys import Versions

# A row to validate: its type is kept, so a typed row comes back typed.
R = TypeVar("R", bound=Mapping[str, Any])


def split_valid(rows: list[R], contract: OutputContract) -> tuple[list[R], list[tuple[R, str]]]:
    """Validate a batch under a policy's contract; returns (valid rows, [(invalid row, reason)])."""
    if not rows:
        return [], []
    from backfill_assets.domain.policy import _frames

    return _frames.split_valid(rows, contract)


def stored_result_problems(
    rows: Sequence[Mapping[str, Any]], contract: OutputContract, versions: Versions
) -> list[tuple[str, str]]:
    """(key, reason) for every stored result row that fails the schema (the contract applies
    to the rows of ``versions``); [] when all pass."""
    if not rows:
        return []
    from backfill_assets.domain.policy import _frames

    return _frames.stored_result_problems(rows, contract, versions)


def warm_up(contract: OutputContract) -> None:
    """Import the schemas and validate one synthetic row, once per process and contract,
    before the first provider call (so the first flush does not stall calls in flight)."""
    from backfill_assets.domain.policy import _frames

    _frames.warm_up(contract)
