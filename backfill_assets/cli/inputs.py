"""Command-line values checked against what exists, with a "did you mean" for a typo.

Fixed sets (slices, outcomes, check names) are argparse types, so a typo fails while parsing;
tenants are checked against the store (or, for ``launch``, the webserver) by the command.
Either way the exit code is 2 and the message names the argument and the value.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from backfill_assets.domain.errors import UserError
from backfill_assets.domain.policy import Policy, PolicyInvalid, load_policy
from backfill_assets.domain.ranges import shown
from backfill_assets.domain.work import (
    SLICE_COUNT,
    SLICE_KEYS,
    InvalidTenantId,
    validate_tenant_id,
)

if TYPE_CHECKING:
    import sqlalchemy as sa

    from backfill_assets.config.settings import Settings

_SLICE_RE = re.compile(r"s?(\d{1,3})")


def did_you_mean(value: str, known: Iterable[str]) -> str:
    """``"; did you mean acme?"`` for the closest known values, or ``""``."""
    close = difflib.get_close_matches(value.lower(), sorted(set(known)), n=3, cutoff=0.6)
    if not close:
        return ""
    named = close[0] if len(close) == 1 else ", ".join(close[:-1]) + " or " + close[-1]
    return f"; did you mean {named}?"


def _unknown(what: str, value: str, known: Sequence[str]) -> str:
    hint = did_you_mean(value, known)
    if hint:
        return f"unknown {what} {shown(value)}{hint}"
    if not known:
        return f"unknown {what} {shown(value)}: there are none yet"
    listed = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
    return f"unknown {what} {shown(value)}; known: {listed}"


def known_tenants(values: Sequence[str], known: Sequence[str], flag: str = "--tenant") -> list[str]:
    """The given tenants, each a valid id that ``known`` has; else UserError naming it."""
    out = []
    for v in values:
        try:
            tenant = validate_tenant_id(v)
        except InvalidTenantId as exc:
            raise UserError(f"argument {flag}: {exc}{did_you_mean(v, known)}") from None
        if tenant not in known:
            hint = "" if known else " (`backfill-moderation import PATH` registers tenants)"
            raise UserError(f"argument {flag}: {_unknown('tenant', tenant, known)}{hint}")
        out.append(tenant)
    return out


def known_value(values: Sequence[str], known: Sequence[str], what: str, flag: str) -> list[str]:
    """Values that must be in ``known`` (free text, e.g. a rejected line's tenant value)."""
    for v in values:
        if v not in known:
            raise UserError(f"argument {flag}: {_unknown(what, v, known)}")
    return list(values)


def choice(what: str, options: Sequence[str]) -> Callable[[str], str]:
    """An argparse ``type`` accepting one of ``options``, suggesting the closest on a typo."""

    def parse(value: str) -> str:
        if value in options:
            return value
        raise argparse.ArgumentTypeError(_unknown(what, value, options))

    parse.__name__ = what
    return parse


def slice_key(value: str) -> str:
    """An argparse ``type`` for a slice: ``s03``, ``s3``, ``03`` or ``3``."""
    m = _SLICE_RE.fullmatch(value.strip().lower())
    if m and int(m.group(1)) < SLICE_COUNT:
        return SLICE_KEYS[int(m.group(1))]
    # Numbers out of range have no useful "closest" slice: the range says it all.
    hint = "" if m else did_you_mean(value, SLICE_KEYS)
    expected = f"expected s00..s{SLICE_COUNT - 1:02d} or 0..{SLICE_COUNT - 1}"
    raise argparse.ArgumentTypeError(f"unknown slice {shown(value)}{hint}; {expected}")


def require_gate(settings: Settings) -> None:
    """``BACKFILL_POLICY_MIN_MACRO_F1``: the policy in force (with the model) must have a
    passing evaluation, or the command stops here (exit 2, naming the gate)."""
    gate = settings.policy_gate()
    if gate is None:
        return
    from backfill_assets.runner.api import gate_result, model_resource
    from backfill_assets.runner.queries import engine_for

    engine = engine_for(settings.store.url)
    model = model_resource(settings).model
    check_result = gate_result(engine, settings.rubric(), model, gate)
    if not check_result.passed:
        raise UserError(check_result.summary)


def load_user_policy(path: str) -> Policy:
    """A policy file named on the command line (``--policy``); its problems are exit 2."""
    try:
        return load_policy(path)
    except PolicyInvalid as exc:
        raise UserError(f"argument --policy: {exc}") from None


def store_tenants(engine: sa.Engine, values: list[str]) -> list[str]:
    """The ``--tenant`` values, each known to the store; all tenants when none is given."""
    from backfill_assets.runner.queries import read_tx, tenant_ids

    with read_tx(engine) as conn:
        known = tenant_ids(conn)
    return known_tenants(values, known) or known
