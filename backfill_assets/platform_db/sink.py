"""Labels back into the platform's own table (``BACKFILL_SINK_URL``): keyed, batched upserts
that are idempotent and never put an older policy version's label over a newer one's.

The store's ``applied_labels`` is the source: the rows of one partition and policy version,
read in ``post_id`` order a batch at a time (keyset, so memory follows the batch), each batch
upserted on (tenant_id, post_id, policy_id) in one sink transaction. A row is rewritten only
where it differs and the sink does not hold a newer version of the same policy, so a replay
changes nothing, not even ``written_at``. When the partition's last batch has committed, the
write-back is recorded in the store (``sink_writes``); a partition applied in the store since
then, or never written, is a gap that ``verify`` reports and the next ``run`` fills.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.schema import CreateTable

from backfill_assets.config.sink_names import DEFAULT_BATCH, DEFAULT_TABLE, split_table_name
from backfill_assets.config.variables import DataSettings
from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.urls import redact_url
from backfill_assets.domain.work.keys import partition_of
from backfill_assets.ledger.dialect import insert_for
from backfill_assets.ledger.engine import write_tx
from backfill_assets.ledger.run.posts import slice_levels
from backfill_assets.ledger.tables import (
    HUMAN,
    applied_labels,
    decisions,
    policy_versions,
    posts,
    results,
    sink_writes,
    utcnow,
)
from backfill_assets.platform_db.connections import PlatformDbError, failure_text, platform_engine
from backfill_assets.platform_db.sink_upsert import KEY, OPTIONAL, upsert


class SinkError(PlatformDbError):
    """The sink cannot be written or does not have the table it needs (never its password)."""


def sink_table(name: str = DEFAULT_TABLE, optional: Sequence[str] = OPTIONAL) -> sa.Table:
    """The sink table's definition: one row per (tenant, post, policy), the label in force;
    ``optional``: the optional columns it has (``p_label``: the label's probability, NULL where
    none was given; ``stage``: the cascade stage that decided, NULL for one model; ``source``:
    ``human`` for a moderator's decision, ``model`` otherwise), after the others."""
    schema, table = split_table_name(name)
    types: dict[str, Any] = {"p_label": sa.Float, "stage": sa.Text, "source": sa.Text}
    extra: list[sa.Column[Any]] = [
        sa.Column(c, types[c], nullable=True) for c in OPTIONAL if c in optional
    ]
    return sa.Table(
        table,
        sa.MetaData(schema=schema),
        sa.Column("tenant_id", sa.String(40), nullable=False),
        sa.Column("post_id", sa.String(200), nullable=False),
        sa.Column("policy_id", sa.String(40), nullable=False),
        sa.Column("label", sa.Text, nullable=False),
        sa.Column("rule_ids", sa.Text, nullable=False),
        sa.Column("confidence", sa.Float, nullable=False),
        sa.Column("policy_version", sa.Text, nullable=False),
        sa.Column("key_version", sa.Text, nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("content_hash", sa.Text, nullable=False),
        sa.Column("labelled_at", sa.DateTime, nullable=False),
        sa.Column("written_at", sa.DateTime, nullable=False),
        *extra,
        sa.PrimaryKeyConstraint(*KEY, name=f"{table}_pkey"),
    )


@dataclass(frozen=True)
class Sink:
    """Where labels are written back: a database URL (a secret), a table, a batch size."""

    url: str = field(repr=False)
    table: str = DEFAULT_TABLE
    batch: int = DEFAULT_BATCH

    @property
    def name(self) -> str:
        """How messages name the sink: the URL redacted, and the table."""
        return f"sink {redact_url(self.url)} table {self.table}"

    @property
    def sink_id(self) -> str:
        """Stable id of (database, table) in the store's records; no secret in it."""
        return hashlib.sha256(f"{redact_url(self.url)}|{self.table}".encode()).hexdigest()[:16]

    def engine(self) -> Engine:
        """An engine on the sink database."""
        return platform_engine(self.url, SinkError)

    def error(self, exc: Exception) -> SinkError:
        """A driver's error as a message naming the sink, never its password."""
        return SinkError(f"{self.name}: {failure_text(self.url, exc)}")


def ddl(name: str, dialect: str) -> str:
    """``CREATE TABLE`` of the sink table for ``dialect`` (postgresql, sqlite, or any other
    SQLAlchemy dialect name installed here), for the operator to review and run."""
    try:
        found = sa.engine.make_url(f"{dialect}://").get_dialect()()
    except Exception:
        raise ValueError(f"unknown SQL dialect {dialect!r} (e.g. postgresql, sqlite)") from None
    return str(CreateTable(sink_table(name)).compile(dialect=found)).strip() + ";"


def check(sink: Sink) -> list[str]:
    """What is wrong with the sink's table ([] when it can be written): it must exist with
    every column, and its primary key or a unique constraint must be (tenant_id, post_id,
    policy_id)."""
    schema, table = split_table_name(sink.table)
    engine = sink.engine()
    try:
        with engine.connect() as conn:
            inspector = sa.inspect(conn)
            if not inspector.has_table(table, schema=schema):
                return [f"table {sink.table} does not exist (`backfill-moderation sink ddl`)"]
            have = {c["name"] for c in inspector.get_columns(table, schema=schema)}
            wanted = [c.name for c in sink_table(sink.table, ()).columns]
            problems = [f"column {c} is missing" for c in wanted if c not in have]
            pk = inspector.get_pk_constraint(table, schema=schema).get("constrained_columns")
            keys: list[set[object]] = [set(pk or [])]
            keys += [
                set(u["column_names"]) for u in inspector.get_unique_constraints(table, schema)
            ]
            keys += [
                set(i["column_names"])
                for i in inspector.get_indexes(table, schema=schema)
                if i.get("unique")
            ]
            if set(KEY) not in keys:
                problems.append(
                    "no primary key or unique constraint on exactly (tenant_id, post_id, "
                    "policy_id): upserts need one"
                )
            return problems
    except sa.exc.SQLAlchemyError as exc:
        raise sink.error(exc) from None
    finally:
        engine.dispose()


@dataclass
class SinkReport:
    """One partition's write-back."""

    rows: int = 0
    changed: int = 0
    batches: int = 0


def _partition_rows(
    tenant_id: str, slices: Sequence[int], key_version: str, policy_id: str, table: sa.Table
) -> sa.Select[Any]:
    """The sink's columns of a partition's labels, ``applied_at`` where ``written_at`` goes,
    then the optional columns ``table`` has. The labels are this version's and the
    moderators' decisions in force under the policy id, whatever version they were made under
    (a decision is certain: confidence 1, labelled when it was decided)."""
    al = applied_labels
    optional = [al.c.source if c == "source" else results.c[c] for c in OPTIONAL if c in table.c]
    return (
        sa.select(
            al.c.tenant_id,
            al.c.post_id,
            al.c.policy_id,
            al.c.label,
            al.c.rule_ids,
            sa.func.coalesce(results.c.confidence, 1.0).label("confidence"),
            al.c.policy_version,
            al.c.key_version,
            al.c.model,
            al.c.content_hash,
            sa.func.coalesce(results.c.created_at, decisions.c.decided_at).label("labelled_at"),
            al.c.applied_at,
            *optional,
        )
        .join(posts, sa.and_(posts.c.tenant_id == al.c.tenant_id, posts.c.post_id == al.c.post_id))
        .outerjoin(results, results.c.key == al.c.result_key)
        .outerjoin(decisions, decisions.c.decision_key == al.c.result_key)
        .where(
            al.c.tenant_id == tenant_id,
            al.c.policy_id == policy_id,
            sa.or_(al.c.key_version == key_version, al.c.source == HUMAN),
            posts.c.slice.in_(list(slices)),
        )
        .order_by(al.c.post_id)
    )


def _batches(store: Engine, stmt: sa.Select[Any], size: int) -> Iterator[list[sa.Row[Any]]]:
    """``stmt``'s rows a batch at a time, each read after the last ``post_id`` (keyset)."""
    after: str | None = None
    while True:
        page = stmt if after is None else stmt.where(applied_labels.c.post_id > after)
        with store.connect() as conn:
            rows = list(conn.execute(page.limit(size)))
        if not rows:
            return
        yield rows
        if len(rows) < size:
            return
        after = rows[-1].post_id


def write_partition(
    store: Engine,
    sink: Sink,
    sink_conn: Connection,
    tenant_id: str,
    slices: Sequence[int],
    policy: Policy,
    newer: list[str],
) -> SinkReport:
    """Write one partition's applied labels of ``policy`` into the sink, a batch per
    transaction, then record the write-back in the store. Raises ``SinkError`` (nothing is
    recorded; the batches already committed stay, and a rerun writes the rest)."""
    report = SinkReport()
    through: dt.datetime | None = None
    try:
        table = sink_table(sink.table, _optional_present(sink_conn, sink.table))
        stmt = _partition_rows(tenant_id, slices, policy.key_version, policy.policy_id, table)
        at = _WRITTEN_AT
        for batch in _batches(store, stmt, sink.batch):
            now = utcnow()
            # The select's columns are the sink's, with applied_at where written_at goes.
            rows = [(*r[:at], now, *r[at + 1 :]) for r in batch]
            newest = max(r[at] for r in batch)
            through = newest if through is None else max(through, newest)
            with sink_conn.begin():
                report.changed += upsert(sink_conn, table, rows, newer)
            report.rows += len(rows)
            report.batches += 1
    except sa.exc.SQLAlchemyError as exc:
        raise sink.error(exc) from None
    _record(store, sink, tenant_id, slices, policy.key_version, report.rows, through)
    return report


# Where written_at (applied_at, in the select) sits among the sink's columns.
_WRITTEN_AT = 11


def _optional_present(conn: Connection, name: str) -> tuple[str, ...]:
    """The optional columns the sink's table has (a table made before them lacks them)."""
    schema, table = split_table_name(name)
    with conn.begin():  # its own: each batch then begins one
        have = {c["name"] for c in sa.inspect(conn).get_columns(table, schema=schema)}
    return tuple(c for c in OPTIONAL if c in have)


def _record(
    store: Engine,
    sink: Sink,
    tenant_id: str,
    slices: Sequence[int],
    key_version: str,
    rows: int,
    through: dt.datetime | None,
) -> None:
    with write_tx(store) as conn:
        stmt = insert_for(conn, sink_writes)
        stmt = stmt.on_conflict_do_update(
            index_elements=["sink_id", "tenant_id", "slice", "key_version"],
            set_={
                "rows_written": stmt.excluded.rows_written,
                "applied_through": stmt.excluded.applied_through,
                "written_at": stmt.excluded.written_at,
            },
        )
        now = utcnow()
        conn.execute(
            stmt,
            [
                {
                    "sink_id": sink.sink_id,
                    "tenant_id": tenant_id,
                    "slice": s,
                    "key_version": key_version,
                    # The partition's rows, on the first of its stored slices.
                    "rows_written": rows if i == 0 else 0,
                    "applied_through": through,
                    "written_at": now,
                }
                for i, s in enumerate(sorted(slices))
            ],
        )


def gaps(
    conn: Connection, sink_id: str, key_version: str, tenants: Sequence[str] | None = None
) -> set[tuple[str, int]]:
    """(tenant, stored slice) whose applied labels of ``key_version`` (and the moderators'
    decisions in force under its policy id) are not all in the sink: never written there, or
    applied in the store after the last write-back. One grouped query, whatever the number of
    tenants."""
    al = applied_labels
    pv = policy_versions
    policy_id = sa.select(pv.c.policy_id).where(pv.c.key_version == key_version).scalar_subquery()
    decided = sa.and_(al.c.source == HUMAN, al.c.policy_id == policy_id)
    applied = (
        sa.select(
            al.c.tenant_id,
            posts.c.slice,
            sa.func.max(al.c.applied_at).label("newest"),
        )
        .join(posts, sa.and_(posts.c.tenant_id == al.c.tenant_id, posts.c.post_id == al.c.post_id))
        .where(sa.or_(al.c.key_version == key_version, decided))
        .group_by(al.c.tenant_id, posts.c.slice)
    )
    if tenants is not None:
        applied = applied.where(al.c.tenant_id.in_(list(tenants)))
    a = applied.subquery()
    sw = sink_writes
    stmt = (
        sa.select(a.c.tenant_id, a.c.slice)
        .select_from(
            a.outerjoin(
                sw,
                sa.and_(
                    sw.c.sink_id == sink_id,
                    sw.c.tenant_id == a.c.tenant_id,
                    sw.c.slice == a.c.slice,
                    sw.c.key_version == key_version,
                ),
            )
        )
        .where(sa.or_(sw.c.applied_through.is_(None), sw.c.applied_through < a.c.newest))
    )
    return {(str(t), int(s)) for t, s in conn.execute(stmt)}


def gap_partitions(
    conn: Connection, sink_id: str, key_version: str, tenants: Sequence[str] | None = None
) -> set[tuple[str, int, int]]:
    """The partitions holding ``gaps``: (tenant, partition number, slice level), each stored
    slice folded by its tenant's level."""
    found = gaps(conn, sink_id, key_version, tenants)
    levels = slice_levels(conn, {t for t, _s in found})
    return {(t, partition_of(s, levels[t]), levels[t]) for t, s in found if t in levels}


def sink_of(data: DataSettings) -> Sink | None:
    """Where ``applied_labels`` writes labels back, if ``BACKFILL_SINK_URL`` is set."""
    if not data.sink_url:
        return None
    return Sink(url=data.sink_url, table=data.sink_table, batch=data.sink_batch)
