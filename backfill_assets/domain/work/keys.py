"""Stable, content-derived work keys and slices (pure).

A key names one unit of paid work: the same post under the same task, prompt and model
always maps to the same key; anything that changes the answer changes the key.
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from dataclasses import dataclass

TENANT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
SLICE_COUNT = 16
SLICE_KEYS: tuple[str, ...] = tuple(f"s{i:02d}" for i in range(SLICE_COUNT))


class InvalidTenantId(ValueError):
    """A tenant id that does not match ``TENANT_ID_RE``."""


def validate_tenant_id(tenant_id: object) -> str:
    """Return the tenant id if it is well-formed, else raise ``InvalidTenantId``."""
    if not isinstance(tenant_id, str) or not TENANT_ID_RE.fullmatch(tenant_id):
        raise InvalidTenantId(f"invalid tenant id {str(tenant_id)[:48]!r}")
    return tenant_id


def normalize_text(text: str) -> str:
    """NFC-normalise so that canonically equal texts hash the same."""
    return unicodedata.normalize("NFC", text)


def content_hash(text: str) -> str:
    """sha256 hex of the NFC form of ``text``."""
    return hashlib.sha256(normalize_text(text).encode("utf-8")).hexdigest()


def _frame(fields: tuple[str, ...]) -> bytes:
    # Length-prefixed fields ("<len>:<bytes>") are unambiguous whatever the fields contain,
    # so ("a", "bc") and ("ab", "c") can never collide.
    parts = []
    for field in fields:
        raw = field.encode("utf-8")
        parts.append(b"%d:%b" % (len(raw), raw))
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class Versions:
    """What, besides the post, decides the answer: task, prompt and model."""

    task_version: str
    key_version: str
    model: str
    # How stored answers are read onto the policy (``Policy.mapping_version``): not part of
    # any key, part of the code version ('' in chat-json).
    mapping: str = ""

    @property
    def code_version(self) -> str:
        """The Dagster code version of the labels asset."""
        base = f"task={self.task_version};prompt={self.key_version};model={self.model}"
        return f"{base};mapping={self.mapping}" if self.mapping else base


def work_key(versions: Versions, tenant_id: str, post_id: str, text_hash: str) -> str:
    """sha256(task_version, key_version, model, tenant_id, post_id, sha256(NFC(text)))."""
    # The versions' frame is the same for every key of a run: hash it once and copy the state.
    digest = _versions_digest(versions).copy()
    digest.update(_frame((tenant_id, post_id, text_hash)))
    return digest.hexdigest()


@functools.lru_cache(maxsize=16)
def _versions_digest(versions: Versions) -> hashlib._Hash:
    return hashlib.sha256(_frame((versions.task_version, versions.key_version, versions.model)))


def slice_of(tenant_id: str, post_id: str) -> int:
    """Bucket of a post: a pure function of its identity, stable under re-export."""
    digest = hashlib.sha256(_frame((tenant_id, post_id))).digest()
    return int.from_bytes(digest[:8], "big") % SLICE_COUNT


# A tenant spreads its posts over 2**level of its SLICE_COUNT partitions: a small tenant uses
# one partition, a big one all of them. A post's stored slice (``slice_of``) never changes; the
# partition that holds it is ``slice % 2**level``, so as a tenant grows its partitions only
# split (s00 -> s00 + s01 -> s00..s03 ...), and at the top level partition = slice.
assert SLICE_COUNT & (SLICE_COUNT - 1) == 0, "SLICE_COUNT must be a power of two"
MAX_LEVEL = SLICE_COUNT.bit_length() - 1
# Default posts per partition before a tenant's partitions split (BACKFILL_SLICE_TARGET_POSTS).
DEFAULT_SLICE_TARGET = 5_000


def level_for(posts: int, target: int) -> int:
    """The smallest level whose partitions hold at most ``target`` posts each (0..MAX_LEVEL)."""
    if target <= 0:
        return MAX_LEVEL
    level = 0
    while level < MAX_LEVEL and posts > target << level:
        level += 1
    return level


def partition_slices(partition: int, level: int) -> tuple[int, ...]:
    """The stored slices partition ``partition`` holds at ``level``; () if it holds none."""
    step = 1 << level
    if not 0 <= partition < step:
        return ()
    return tuple(range(partition, SLICE_COUNT, step))


def partition_of(slice_no: int, level: int) -> int:
    """The partition holding stored slice ``slice_no`` at ``level``."""
    return slice_no % (1 << level)


def slice_key(slice_no: int) -> str:
    """Partition key of a slice number (``3`` -> ``"s03"``)."""
    return SLICE_KEYS[slice_no]


def slice_no(key: str) -> int:
    """Slice number of a partition key (``"s03"`` -> ``3``)."""
    if key not in SLICE_KEYS:
        raise ValueError(f"unknown slice {key!r}; expected one of s00..s{SLICE_COUNT - 1:02d}")
    return int(key[1:])
