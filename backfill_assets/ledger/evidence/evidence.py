"""The rows the checks and ``verify`` read: a partition's or a tenant's posts and every row
that claims it, selected by claim and, for partitions, by expected key (never post text)."""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.domain.checks.rules import PartitionEvidence
from backfill_assets.domain.checks.verify import Row
from backfill_assets.domain.work.events import EventKind
from backfill_assets.domain.work.keys import Versions, work_key
from backfill_assets.ledger.bulk import driver_rows, select_rows, stream_rows
from backfill_assets.ledger.decisions.precedence import IS_HUMAN
from backfill_assets.ledger.engine import is_sqlite
from backfill_assets.ledger.run.partition_groups import Owners, claimed_by, claims, owners_of_all
from backfill_assets.ledger.tables import (
    applied_labels,
    dead_letters,
    decisions,
    ledger_events,
    posts,
    results,
)

# Bound on bind parameters per IN (...) list: SQLite allows 32,766, PostgreSQL 65,535.
_IN_CHUNK = 5_000
# Rows fetched at a time from each of ``tenant_chunks``' streams.
_STREAM_ROWS = 2_000


@dataclass(frozen=True, slots=True)
class Partition:
    """A partition to read or check: its Dagster key, tenant, number and its stored slices."""

    key: str
    tenant_id: str
    slice: int
    slices: tuple[int, ...]


# The columns the verifier and the checks read (never post text, never the wide message or
# request-id columns): fewer columns and mapping rows, not dicts, halve the cost of reading.
# Every row carries its key's derivation; each table adds what its checks read.
_DERIVATION = (
    "key",
    "tenant_id",
    "post_id",
    "slice",
    "content_hash",
    "model",
    "key_version",
    "task_version",
)
_COLUMNS = {
    "results": (*_DERIVATION, "label", "rule_ids", "confidence", "stage"),
    "dead_letters": (*_DERIVATION, "outcome"),
    "ledger_events": (
        *_DERIVATION,
        "id",
        "type",
        "attempt_id",
        "tokens_in",
        "tokens_out",
        "usage_shape",
        "bound_tokens",
    ),
}


def _select(table: sa.Table) -> sa.Select[Any]:
    return sa.select(*(table.c[name] for name in _COLUMNS[table.name]))


def _mappings(result: sa.Result[Any]) -> list[Row]:
    # RowMapping reads like a dict (``row["key"]``) without copying each row.
    return cast(list[Row], result.mappings().all())


def _fetch(conn: Connection, stmt: sa.Select[Any]) -> list[Row]:
    # By column name; on SQLite as sqlite3.Row: building SQLAlchemy's RowMapping objects was a
    # third of a partition's checks, more than the query.
    return cast(list[Row], select_rows(conn, stmt, by_name=True))


def _rows(conn: Connection, table: sa.Table, *where: Any) -> list[Row]:
    return _fetch(conn, _select(table).where(*where))


def _ledger(conn: Connection, *where: Any) -> list[Row]:
    """Ledger rows in the order they were written (the verifier's rebill count needs it)."""
    return _fetch(conn, _select(ledger_events).where(*where).order_by(ledger_events.c.id))


# Posts per chunk of ``tenant_chunks``: its rows cost about 6.3 KB a post in memory.
CHUNK_POSTS = 5_000


@dataclass
class ScopeRows:
    """Some posts of a tenant and every row of the tenant that names one of them."""

    posts: dict[str, str] = field(default_factory=dict)
    results: list[Row] = field(default_factory=list)
    dead: list[Row] = field(default_factory=list)
    ledger: list[Row] = field(default_factory=list)


_HOME = "home_post"


def _by_post(conn: Connection, stmt: sa.Select[Any], post_id: Any, *then: Any) -> Iterator[Row]:
    """``stmt``'s rows whose ``post_id`` (an expression, read back as ``home_post``) is known,
    streamed in post id order.

    Python compares post ids by code point, which is the order of their UTF-8 bytes: SQLite's
    BINARY collation, and PostgreSQL's ``"C"`` whatever the database's own collation.
    """
    order = post_id if is_sqlite(conn.engine) else post_id.collate("C")
    stmt = stmt.add_columns(post_id.label(_HOME)).where(post_id.is_not(None))
    yield from stream_rows(conn, stmt.order_by(order, *then), _STREAM_ROWS)


def _tag(n: int, rows: Iterator[Row]) -> Iterator[tuple[str, int, Row]]:
    for row in rows:
        yield str(row[_HOME]), n, row


def _ledger_with_home(tenant_id: str) -> tuple[sa.Select[Any], Any]:
    """The tenant's ledger rows, and the post each one is about: an attempt's own, and for a
    usage or error event (which names no post) its attempt's."""
    ev = ledger_events
    attempts = (
        sa.select(ev.c.attempt_id, sa.func.min(ev.c.post_id).label("post_id"))
        .where(ev.c.tenant_id == tenant_id, ev.c.type == EventKind.ATTEMPT.value)
        .group_by(ev.c.attempt_id)
        .subquery()
    )
    home = sa.func.coalesce(attempts.c.post_id, ev.c.post_id)
    stmt = (
        _select(ev)
        .select_from(ev.outerjoin(attempts, attempts.c.attempt_id == ev.c.attempt_id))
        .where(ev.c.tenant_id == tenant_id)
    )
    return stmt, home


def tenant_chunks(
    conn: Connection, tenant_id: str, chunk_posts: int = CHUNK_POSTS
) -> Iterator[ScopeRows]:
    """A tenant's posts in chunks of ``chunk_posts`` post ids, each with every row of the
    tenant about one of them; then, if any, the ledger rows about no post of it.

    Rows are selected by the tenant they *claim* (in any slice, so a row filed in the wrong
    one is still read); the verifier proves each one derives from that tenant's post. Four
    streams ordered by post id are merged, so memory follows the chunk, not the tenant: read
    whole, the largest tenant's rows took about 6.3 KB a post (1.6 GB at 2 million posts).
    Everything the verifier pairs up (a result with its post and its attempts, an event with
    its attempt, one key's usage events) is about the same post, so it lands in one chunk.
    """
    ledger, home = _ledger_with_home(tenant_id)
    streams = (
        _by_post(
            conn,
            sa.select(posts.c.content_hash).where(posts.c.tenant_id == tenant_id),
            posts.c.post_id,
        ),
        _by_post(conn, _select(results).where(results.c.tenant_id == tenant_id), results.c.post_id),
        _by_post(
            conn,
            _select(dead_letters).where(dead_letters.c.tenant_id == tenant_id),
            dead_letters.c.post_id,
        ),
        _by_post(conn, ledger, home, ledger_events.c.id),
    )
    tagged = [_tag(n, rows) for n, rows in enumerate(streams)]
    chunk, count, last = ScopeRows(), 0, None
    for post_id, n, row in heapq.merge(*tagged, key=itemgetter(0)):
        if post_id != last:
            if count >= chunk_posts:
                yield chunk
                chunk, count = ScopeRows(), 0
            last = post_id
            count += 1
        if n == 0:
            chunk.posts[post_id] = str(row["content_hash"])
        else:
            (chunk.results, chunk.dead, chunk.ledger)[n - 1].append(row)
    if count:
        yield chunk
    nameless = _fetch(conn, ledger.where(home.is_(None)).order_by(ledger_events.c.id))
    if nameless:
        yield ScopeRows(ledger=nameless)


def _marks(values: Sequence[object]) -> str:
    return ", ".join("?" for _ in values)


def _foreign_by_key(
    conn: Connection, table: sa.Table, keys: list[str], owners: Owners
) -> list[Row]:
    """Rows that carry one of ``keys`` but claim a (tenant, slice) none of ``owners`` holds
    (normally none: the query returns nothing, so its cost is the primary-key probes only).

    Written for the driver: SQLAlchemy expands an IN list one bind parameter at a time, which
    cost more than the probes; PostgreSQL takes the keys as one array parameter.
    """
    cols = ", ".join(_COLUMNS[table.name])
    pairs = claims(owners)
    rows: list[Row] = []
    if is_sqlite(conn.engine):
        claim = " OR ".join(
            f"(tenant_id IN ({_marks(t)}) AND slice IN ({_marks(s)}))" for t, s in pairs
        )
        claim_params = [v for t, s in pairs for v in (*t, *s)]
        for i in range(0, len(keys), _IN_CHUNK):
            chunk = keys[i : i + _IN_CHUNK]
            sql = (
                f"SELECT {cols} FROM {table.name} WHERE key IN ({_marks(chunk)}) AND NOT ({claim})"
            )
            rows += driver_rows(conn, sql, (*chunk, *claim_params), by_name=True)
        return rows
    claim = " OR ".join("(tenant_id = ANY(%s) AND slice = ANY(%s))" for _ in pairs)
    sql = f"SELECT {cols} FROM {table.name} WHERE key = ANY(%s) AND NOT ({claim})"
    params = (keys, *(v for t, s in pairs for v in (t, s)))
    return _mappings(conn.exec_driver_sql(sql, params))


def evidence_of(
    conn: Connection, partitions: Sequence[Partition], versions: Versions
) -> dict[str, PartitionEvidence]:
    """Each partition's posts and every row that claims it *or* carries one of its keys, for
    all of ``partitions`` (by partition key) in five queries: rows are routed to the partition
    that holds their (tenant, slice) and, when they carry one of its expected keys while
    claiming elsewhere, to that partition too.

    A result or dead letter re-labelled to another tenant no longer claims its partition;
    fetching those by expected key too (their primary key) means that partition's isolation
    check still sees it. Ledger rows are fetched by claim only (the ledger has no key index,
    on purpose: it is the hottest insert path); a foreign one fails the isolation check of the
    tenant it claims, because its key does not recompute from that tenant's post.
    ``schema_problems`` is left empty: the caller validates many partitions' results in one
    frame (``stored_result_problems`` has a fixed cost per call).
    """
    owners = owners_of_all(partitions)
    if not owners:
        return {part.key: _no_evidence(part, versions) for part in partitions}
    slice_posts: dict[str, dict[str, str]] = {part.key: {} for part in partitions}
    expected: dict[str, dict[str, str]] = {part.key: {} for part in partitions}
    key_owner: dict[str, str] = {}
    stmt = sa.select(posts.c.tenant_id, posts.c.slice, posts.c.post_id, posts.c.content_hash)
    for tenant_id, slice_no, post_id, content_hash in conn.execute(
        stmt.where(claimed_by(posts, owners))
    ):
        owner = owners.get((str(tenant_id), int(slice_no)))
        if owner is None:
            continue
        slice_posts[owner][str(post_id)] = str(content_hash)
        # Each expected key is computed once here and handed to the verifier.
        key = work_key(versions, str(tenant_id), str(post_id), str(content_hash))
        expected[owner][str(post_id)] = key
        key_owner[key] = owner

    def gather(table: sa.Table) -> dict[str, list[Row]]:
        got: dict[str, list[Row]] = {part.key: [] for part in partitions}
        for row in _rows(conn, table, claimed_by(table, owners)):
            claim = owners.get((row["tenant_id"], row["slice"]))
            if claim is not None:
                got[claim].append(row)
            # A row claimed inside the group but by another partition than its key's.
            by_key = key_owner.get(row["key"])
            if by_key is not None and by_key != claim:
                got[by_key].append(row)
        for row in _foreign_by_key(conn, table, sorted(key_owner), owners):
            got[key_owner[row["key"]]].append(row)
        return {k: sorted(rows, key=itemgetter("key")) for k, rows in got.items()}

    ledger: dict[str, list[Row]] = {part.key: [] for part in partitions}
    for row in _ledger(conn, claimed_by(ledger_events, owners)):
        claim = owners.get((row["tenant_id"], row["slice"]))
        if claim is not None:
            ledger[claim].append(row)
    result_rows, dead = gather(results), gather(dead_letters)
    foreign = _foreign_decisions(conn, partitions, owners)
    return {
        part.key: PartitionEvidence(
            tenant=part.tenant_id,
            slice=part.slice,
            versions=versions,
            posts=slice_posts[part.key],
            results=result_rows[part.key],
            dead=dead[part.key],
            ledger=ledger[part.key],
            expected_keys=expected[part.key],
            foreign_decisions=foreign.get(part.key, ()),
        )
        for part in partitions
    }


def _foreign_decisions(
    conn: Connection, partitions: Sequence[Partition], owners: Owners
) -> dict[str, list[tuple[str, str]]]:
    """Per partition, (post id, why) of each moderator's label in force there that is not a
    decision about that very post of that tenant: isolation holds for people too. Read from
    the decisions in force (a partial index), so a store without any costs one probe."""
    al, d = applied_labels, decisions
    tenants = sorted({p.tenant_id for p in partitions})
    stmt = (
        sa.select(al.c.tenant_id, posts.c.slice, al.c.post_id, d.c.tenant_id, d.c.post_id)
        .join(posts, sa.and_(posts.c.tenant_id == al.c.tenant_id, posts.c.post_id == al.c.post_id))
        .outerjoin(d, d.c.decision_key == al.c.result_key)
        .where(
            IS_HUMAN,
            al.c.tenant_id.in_(tenants),
            sa.or_(
                d.c.decision_key.is_(None),
                d.c.tenant_id != al.c.tenant_id,
                d.c.post_id != al.c.post_id,
                d.c.policy_id != al.c.policy_id,
            ),
        )
    )
    out: dict[str, list[tuple[str, str]]] = {}
    for tenant, slice_no, post, d_tenant, d_post in conn.execute(stmt):
        owner = owners.get((str(tenant), int(slice_no)))
        if owner is None:
            continue
        why = (
            "a human label with no decision behind it"
            if d_tenant is None
            else f"a human label from a decision about {d_tenant}/{d_post}"
        )
        out.setdefault(owner, []).append((str(post), why))
    return out


def _no_evidence(part: Partition, versions: Versions) -> PartitionEvidence:
    """A partition that holds no stored slice (too few posts to split this far)."""
    return PartitionEvidence(
        tenant=part.tenant_id,
        slice=part.slice,
        versions=versions,
        posts={},
        results=[],
        dead=[],
        ledger=[],
        expected_keys={},
    )
