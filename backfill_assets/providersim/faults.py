"""Deterministic fault decisions (pure).

A rule fires when ``sha256(seed, kind, correlation_id[, attempt])`` mapped to [0, 1) is below
its rate. Non-sticky rules hash the attempt number too, so a retry of the same key draws again
and may succeed; sticky rules leave it out, so every attempt of a key fails the same way. No
shared random stream is involved, so concurrency and arrival order cannot change a decision.
"""

from __future__ import annotations

import hashlib

from backfill_assets.providersim.config import FaultKind, FaultRule, SimConfig


def unit_draw(*parts: object) -> float:
    """A reproducible number in [0, 1) derived from ``parts``."""
    material = "\x1f".join(str(part) for part in parts).encode("utf-8")
    digest = hashlib.sha256(material).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def rule_fires(rule: FaultRule, seed: int, correlation_id: str, attempt: int) -> bool:
    """Whether ``rule`` fires for the ``attempt``-th (1-based) attempt of a correlation id."""
    if rule.rate <= 0.0:
        return False
    if rule.sticky:
        draw = unit_draw(seed, rule.kind, correlation_id)
    else:
        draw = unit_draw(seed, rule.kind, correlation_id, attempt)
    return draw < rule.rate


def decide_fault(config: SimConfig, correlation_id: str, attempt: int) -> FaultKind | None:
    """The fault for this attempt, or None; pinned keys first, then rules in order."""
    pinned = config.fault_by_key.get(correlation_id)
    if pinned is not None:
        return pinned
    for rule in config.faults:
        if rule_fires(rule, config.seed, correlation_id, attempt):
            return rule.kind
    return None
