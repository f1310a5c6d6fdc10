"""The policy versions a store has worked under (``policy_versions``, sql/009).

A version is registered before its first call is sent, with its canonical content: the
results of any version can then be checked against that version's own labels and rules (a batch
booked after the policy changed, the checks of an older version's rows), and the apply can
rank versions of one policy without trusting the order runs finish in.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.engine import Connection, Engine

from backfill_assets.domain.policy.dialect_sections import CHAT_JSON, DIALECTS
from backfill_assets.domain.policy.diff import version_order
from backfill_assets.domain.policy.document import (
    LEGACY_KEY_VERSIONS,
    Policy,
    PolicyDoc,
    canonical_json,
    full_json,
)
from backfill_assets.domain.policy.file import builtin_policy
from backfill_assets.domain.policy.output_gate import OutputContract
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.ledger.dialect import insert_for
from backfill_assets.ledger.engine import read_tx, write_tx
from backfill_assets.ledger.tables import policy_versions, utcnow

# ``+<dialect>[@<variant>]`` at the end of a key version.
_DIALECT_SUFFIX = re.compile(r"\+([a-z-]+)(?:@([a-z0-9]+))?$")


def register(conn: Connection, policy: Policy) -> None:
    """Record a policy version (once; later calls change nothing)."""
    row = {
        "key_version": policy.key_version,
        "policy_id": policy.policy_id,
        "version": policy.version,
        "identity": policy.identity,
        "content_hash": policy.content_hash,
        # A dialect's version keeps its section: re-reading it must map answers as it did.
        "document": canonical_json(policy.doc)
        if policy.dialect == CHAT_JSON
        else full_json(policy.doc),
        "registered_at": utcnow(),
    }
    conn.execute(insert_for(conn, policy_versions).values(row).on_conflict_do_nothing())


def register_policy(engine: Engine, policy: Policy) -> None:
    """``register`` in its own transaction."""
    with write_tx(engine) as conn:
        register(conn, policy)


@dataclass(frozen=True, slots=True)
class RegisteredVersion:
    """A policy version as the store registered it."""

    key_version: str
    policy_id: str
    version: str
    identity: str
    registered_at: object

    def rank(self) -> tuple[object, ...]:
        """Order of versions of one policy: by human version (``9`` before ``10``), then, for
        the same version string, by when the store first met it."""
        return (version_order(self.version), str(self.registered_at), self.key_version)


def versions_of(conn: Connection, policy_id: str) -> list[RegisteredVersion]:
    """Every registered version of a policy id, oldest rank first."""
    rows = conn.execute(
        sa.select(
            policy_versions.c.key_version,
            policy_versions.c.policy_id,
            policy_versions.c.version,
            policy_versions.c.identity,
            policy_versions.c.registered_at,
        ).where(policy_versions.c.policy_id == policy_id)
    )
    found = [RegisteredVersion(*r) for r in rows]
    return sorted(found, key=RegisteredVersion.rank)


def registered_policy(conn: Connection, key_version: str) -> Policy | None:
    """The policy a key version names, from its stored content (None: never registered)."""
    doc = conn.execute(
        sa.select(policy_versions.c.document).where(policy_versions.c.key_version == key_version)
    ).scalar()
    if doc is None:
        builtin = builtin_policy()
        legacy = LEGACY_KEY_VERSIONS.get(builtin.content_hash)
        return builtin if legacy == key_version else None
    try:
        policy = Policy(PolicyDoc.model_validate_json(str(doc)))
        dialect, variant = dialect_of(key_version)
        return policy.in_dialect(dialect, variant)
    except (ValidationError, ValueError):
        return None


def dialect_of(key_version: str) -> tuple[str, str]:
    """The dialect and variant a key version names (``Policy.key_version``'s suffix)."""
    found = _DIALECT_SUFFIX.search(key_version)
    if found is None or found[1] not in DIALECTS:
        return CHAT_JSON, ""
    return found[1], found[2] or ""


def rubric_lookup(engine: Engine, rubric: Rubric) -> Callable[[str], Rubric | None]:
    """A key version -> how its answers are read: the rubric's own, else the registered
    policy's in its dialect (read once per version)."""

    @functools.cache
    def other(key_version: str) -> Rubric | None:
        with read_tx(engine) as conn:
            policy = registered_policy(conn, key_version)
        return None if policy is None else Rubric(policy, policy.dialect, policy.variant)

    def lookup(key_version: str) -> Rubric | None:
        return rubric if key_version == rubric.key_version else other(key_version)

    return lookup


def contract_lookup(engine: Engine, rubric: Rubric) -> Callable[[str], OutputContract | None]:
    """A result's key version -> its policy's output contract (``rubric_lookup``'s)."""
    readers = rubric_lookup(engine, rubric)

    def lookup(key_version: str) -> OutputContract | None:
        reader = readers(key_version)
        return None if reader is None else reader.contract

    return lookup
