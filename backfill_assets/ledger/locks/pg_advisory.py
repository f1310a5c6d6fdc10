"""PostgreSQL's writer locks: session advisory locks, one key a partition name.

A bigint key per partition, taken, proven and released in one round trip each for a run's
partitions (one each was three statements: the lock, its BEGIN and COMMIT).
"""

from __future__ import annotations

import hashlib

import sqlalchemy as sa


def pg_lock_id(name: str) -> int:
    """The advisory lock key of a partition name (signed 64-bit, as PostgreSQL wants it)."""
    return int.from_bytes(
        hashlib.sha256(f"backfill:{name}".encode()).digest()[:8], "big", signed=True
    )


# A bigint advisory key is stored as classid (high half) and objid (low half), objsubid 1.
_KEY = "((classid::bigint << 32) | objid::bigint)"
HELD_ADVISORY = sa.text(
    f"SELECT {_KEY} AS k FROM pg_locks"
    " WHERE locktype = 'advisory' AND objsubid = 1 AND granted AND pid = pg_backend_pid()"
)
# Take locks, and say which backend took them (one round trip for a run's partitions).
TAKE = sa.text(
    "SELECT pg_backend_pid() AS pid, k, pg_try_advisory_lock(k) AS ok"
    " FROM unnest(CAST(:keys AS bigint[])) AS k"
)
RELEASE = sa.text("SELECT pg_advisory_unlock(k) FROM unnest(CAST(:keys AS bigint[])) AS k")
# The fence: which backend this is, and how many of ``keys`` it holds (one round trip).
FENCE = sa.text(
    "SELECT pg_backend_pid() AS pid, count(*) AS held FROM pg_locks"
    " WHERE locktype = 'advisory' AND objsubid = 1 AND granted AND pid = pg_backend_pid()"
    f" AND {_KEY} = ANY(:keys)"
)
# Who holds ``keys`` now, for the message of a takeover.
HOLDERS = sa.text(
    "SELECT l.pid, a.application_name, a.backend_start FROM pg_locks l"
    " LEFT JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND ((l.classid::bigint << 32) | l.objid::bigint) = ANY(:keys) AND l.pid <> :mine"
)
