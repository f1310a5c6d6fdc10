"""Fetch a scope's posts and rows for the pure verifier."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from backfill_assets.audit.check_rules import CheckBounds, PartitionEvidence, Verdict, evaluate
from backfill_assets.audit.verify import (
    BLOCKING_KINDS,
    Problem,
    Row,
    ScopeReport,
    usage_rollup_problems,
    verify_scope,
)
from backfill_assets.core.keys import Versions, slice_key, work_key
from backfill_assets.core.rubric import OutputContract
from backfill_assets.core.validation import stored_result_problems
from backfill_assets.store.bulk import driver_rows, select_rows
from backfill_assets.store.engine import is_sqlite, read_tx
from backfill_assets.store.sink import Sink, gap_partitions
from backfill_assets.store.tables import (
    dead_letters,
    ledger_events,
    posts,
    results,
    tenants,
    usage_daily,
)
from backfill_assets.store.usage import rollup_totals

# Bound on bind parameters per IN (...) list: SQLite allows 32,766, PostgreSQL 65,535.
_IN_CHUNK = 5_000


@dataclass
class VerifyOutcome:
    """Everything ``verify`` reports."""

    reports: list[ScopeReport]
    problems: list[Problem]
    # With a sink: its name, and the partitions (tenant, partition key) whose applied labels
    # are not all written back there yet.
    sink: str | None = None
    sink_pending: list[tuple[str, str]] = field(default_factory=list)

    def blocking(self, require_complete: bool) -> bool:
        """True when the outcome must fail the command or check."""
        if any(p.kind in BLOCKING_KINDS for p in self.problems):
            return True
        return require_complete and (
            any(r.missing for r in self.reports if not r.evaluation) or bool(self.sink_pending)
        )

    def as_dict(self, require_complete: bool = False, max_problems: int = 200) -> dict[str, Any]:
        """The ``verify --json`` document."""
        problems = [
            {"kind": p.kind, "tenant": p.tenant, "table": p.table, "key": p.key, "detail": p.detail}
            for p in self.problems[:max_problems]
        ]
        if require_complete:
            problems += [
                {
                    "kind": "missing",
                    "tenant": r.tenant,
                    "table": "results",
                    "key": k,
                    "detail": f"{r.missing} expected key(s) neither accepted nor dead-lettered",
                }
                for r in self.reports
                if r.missing and not r.evaluation
                for k in r.missing_keys[:1]
            ]
        problems += [
            {
                "kind": "sink_pending",
                "tenant": tenant,
                "table": "sink",
                "key": partition,
                "detail": f"applied in the store, not yet written back to {self.sink}",
            }
            for tenant, partition in self.sink_pending[:max_problems]
        ]
        doc: dict[str, Any] = {
            "ok": not self.blocking(require_complete),
            "problems": problems,
            "problems_total": len(self.problems) + len(self.sink_pending),
            "tenants": [r.as_dict() for r in self.reports],
        }
        if self.sink is not None:
            doc["sink"] = {"name": self.sink, "pending_partitions": len(self.sink_pending)}
        return doc


# The columns the verifier and the checks read (never post text, never the wide message or
# request-id columns): fewer columns and mapping rows, not dicts, halve the cost of reading.
# Every row carries its key's derivation; each table adds what its checks judge.
_DERIVATION = (
    "key",
    "tenant_id",
    "post_id",
    "slice",
    "content_hash",
    "model",
    "prompt_version",
    "task_version",
)
_COLUMNS = {
    "results": (*_DERIVATION, "label", "rule_ids", "confidence"),
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


@dataclass
class ScopeRows:
    """A scope's posts (for coverage), the tenant's posts (for derivation) and claimed rows."""

    posts: dict[str, str]
    known_posts: dict[str, str]
    results: list[Row]
    dead: list[Row]
    ledger: list[Row]


def scope_rows(conn: Connection, tenant_id: str, slice_no: int | None = None) -> ScopeRows:
    """Posts and rows of a tenant or of one of its partitions.

    Rows are selected by the tenant they *claim*; the verifier then proves each one derives
    from that tenant's post.
    """
    rw = [results.c.tenant_id == tenant_id]
    dw = [dead_letters.c.tenant_id == tenant_id]
    lw = [ledger_events.c.tenant_id == tenant_id]
    known = {
        str(post_id): (str(content_hash), int(slice_))
        for post_id, content_hash, slice_ in conn.execute(
            sa.select(posts.c.post_id, posts.c.content_hash, posts.c.slice).where(
                posts.c.tenant_id == tenant_id
            )
        )
    }
    if slice_no is not None:
        rw.append(results.c.slice == slice_no)
        dw.append(dead_letters.c.slice == slice_no)
        lw.append(ledger_events.c.slice == slice_no)
    ledger = _ledger(conn, *lw)
    return ScopeRows(
        posts={p: h for p, (h, s) in known.items() if slice_no is None or s == slice_no},
        known_posts={p: h for p, (h, _s) in known.items()},
        results=_rows(conn, results, *rw),
        dead=_rows(conn, dead_letters, *dw),
        ledger=ledger,
    )


def _foreign_by_key(
    conn: Connection, table: sa.Table, keys: list[str], tenant_id: str, slices: Sequence[int]
) -> list[Row]:
    """Rows that carry one of ``keys`` but claim another tenant or slice (normally none: the
    query returns nothing, so its cost is the primary-key probes only).

    Written for the driver: SQLAlchemy expands an IN list one bind parameter at a time, which
    cost more than the probes; PostgreSQL takes the keys as one array parameter.
    """
    cols = ", ".join(_COLUMNS[table.name])
    rows: list[Row] = []
    if is_sqlite(conn.engine):
        marks = ", ".join("?" for _ in slices)
        for i in range(0, len(keys), _IN_CHUNK):
            chunk = keys[i : i + _IN_CHUNK]
            sql = (
                f"SELECT {cols} FROM {table.name} WHERE key IN ({', '.join('?' for _ in chunk)})"
                f" AND NOT (tenant_id = ? AND slice IN ({marks}))"
            )
            rows += driver_rows(conn, sql, (*chunk, tenant_id, *slices), by_name=True)
        return rows
    sql = (
        f"SELECT {cols} FROM {table.name} WHERE key = ANY(%s)"
        " AND NOT (tenant_id = %s AND slice = ANY(%s))"
    )
    return _mappings(conn.exec_driver_sql(sql, (keys, tenant_id, list(slices))))


def partition_evidence(
    conn: Connection,
    tenant_id: str,
    slice_no: int,
    slices: Sequence[int],
    versions: Versions,
    contract: OutputContract,
    validate: bool = True,
) -> PartitionEvidence:
    """One partition's posts and every row that claims it *or* carries one of its keys.

    A result or dead letter re-labelled to another tenant no longer claims this partition;
    fetching those by expected key too (their primary key) means this partition's isolation
    check still sees it. Ledger rows are fetched by claim only (the ledger has no key index,
    on purpose: it is the hottest insert path); a foreign one fails the isolation check of the
    tenant it claims, because its key does not recompute from that tenant's post.

    ``contract`` judges the results of ``versions`` (the policy in force). ``validate=False``
    leaves ``schema_problems`` empty for a caller that validates many partitions' rows in one
    frame (``stored_result_problems`` has a fixed cost per call).
    """
    slice_posts = {
        str(post_id): str(content_hash)
        for post_id, content_hash in conn.execute(
            sa.select(posts.c.post_id, posts.c.content_hash).where(
                posts.c.tenant_id == tenant_id, posts.c.slice.in_(list(slices))
            )
        )
    }
    # Each expected key is computed once here and handed to the verifier.
    expected = {p: work_key(versions, tenant_id, p, h) for p, h in slice_posts.items()}
    keys = sorted(expected.values())
    chosen = list(slices)

    def gather(table: sa.Table) -> list[Row]:
        claimed = _rows(conn, table, table.c.tenant_id == tenant_id, table.c.slice.in_(chosen))
        foreign = _foreign_by_key(conn, table, keys, tenant_id, chosen)
        return sorted(claimed + foreign, key=itemgetter("key"))

    result_rows = gather(results)
    ledger = _ledger(
        conn, ledger_events.c.tenant_id == tenant_id, ledger_events.c.slice.in_(chosen)
    )
    return PartitionEvidence(
        tenant=tenant_id,
        slice=slice_no,
        versions=versions,
        posts=slice_posts,
        results=result_rows,
        dead=gather(dead_letters),
        ledger=ledger,
        schema_problems=(
            stored_result_problems(result_rows, contract, versions) if validate else []
        ),
        expected_keys=expected,
    )


@dataclass(frozen=True, slots=True)
class Scope:
    """A partition to judge: its Dagster key, tenant, number and the stored slices it holds."""

    key: str
    tenant_id: str
    slice: int
    slices: tuple[int, ...]


Baseline = tuple[dict[str, float] | None, str]
# Rows (results + ledger) held for one schema frame: pandera's fixed cost per frame spread
# over many partitions, memory still bounded.
_BATCH_ROWS = 60_000


@dataclass(frozen=True)
class Judging:
    """What a run's partitions are judged against: the code version, the output contract of
    its policy, the check bounds, the checks to evaluate, each tenant's drift baseline, the
    keys each partition deferred (by partition key) and how many sample keys a verdict names."""

    versions: Versions
    contract: OutputContract
    bounds: CheckBounds
    names: tuple[str, ...]
    baselines: Mapping[str, Baseline]
    deferred: Mapping[str, int | None]
    sample: int


def judge_partitions(
    engine: Engine, scopes: Sequence[Scope], judging: Judging
) -> dict[str, list[Verdict]]:
    """Each partition's verdicts: rows read per partition, the stored-result schema validated
    in one frame per batch of partitions.

    Memory is bounded by one batch (``_BATCH_ROWS`` rows, or one partition if larger), not by
    the run: a batch is judged and dropped before the next is read.
    """
    out: dict[str, list[Verdict]] = {}
    batch: list[tuple[Scope, PartitionEvidence]] = []
    held = 0
    names = judging.names

    def judge() -> None:
        nonlocal batch, held
        if "output_schema" in names:
            _validate_stored([ev for _scope, ev in batch], judging)
        for scope, ev in batch:
            if scope.tenant_id in judging.baselines:
                ev.baseline, ev.baseline_source = judging.baselines[scope.tenant_id]
            ev.deferred = judging.deferred.get(scope.key)
            out[scope.key] = evaluate(ev, judging.bounds, names, sample=judging.sample)
        batch, held = [], 0

    with read_tx(engine) as conn:
        for scope in scopes:
            ev = partition_evidence(
                conn,
                scope.tenant_id,
                scope.slice,
                scope.slices,
                judging.versions,
                judging.contract,
                validate=False,
            )
            batch.append((scope, ev))
            held += len(ev.results) + len(ev.ledger)
            if held >= _BATCH_ROWS:
                judge()
    judge()
    return out


def _validate_stored(evidence: Sequence[PartitionEvidence], judging: Judging) -> None:
    """Fill each partition's ``schema_problems`` from one frame over all their results."""
    unique = {r["key"]: r for ev in evidence for r in ev.results}
    bad: dict[str, list[str]] = {}
    rows = list(unique.values())
    for key, why in stored_result_problems(rows, judging.contract, judging.versions):
        bad.setdefault(key, []).append(why)
    for ev in evidence:
        ev.schema_problems = [(r["key"], why) for r in ev.results for why in bad.get(r["key"], [])]


def verify_store(
    engine: Engine,
    versions: Versions,
    tenant_filter: Sequence[str] | None = None,
    sink: Sink | None = None,
) -> VerifyOutcome:
    """Verify every tenant that has posts or claims rows (and, with ``sink``, which of their
    partitions are applied in the store but not yet written back)."""
    reports: list[ScopeReport] = []
    problems: list[Problem] = []
    with read_tx(engine) as conn:
        names: set[str] = set()
        for table in (tenants, results, dead_letters, ledger_events, usage_daily):
            names.update(
                str(t) for t in conn.execute(sa.select(table.c.tenant_id).distinct()).scalars()
            )
        if tenant_filter:
            names &= set(tenant_filter)
        gold = set(
            conn.execute(
                sa.select(tenants.c.tenant_id).where(tenants.c.purpose.is_not(None))
            ).scalars()
        )
        for tenant_id in sorted(names):
            rows = scope_rows(conn, tenant_id)
            rep, probs = verify_scope(
                tenant_id, rows.posts, rows.results, rows.dead, rows.ledger, versions
            )
            rep.evaluation = tenant_id in gold
            reports.append(rep)
            problems.extend(probs)
            rollup = rollup_totals(conn, tenant_id)
            problems.extend(usage_rollup_problems(tenant_id, rows.ledger, rollup))
        pending: list[tuple[str, str]] = []
        if sink is not None:
            found = gap_partitions(
                conn, sink.sink_id, versions.prompt_version, tenant_filter or None
            )
            pending = sorted((t, slice_key(n)) for t, n, _level in found)
    return VerifyOutcome(
        reports=reports,
        problems=problems,
        sink=None if sink is None else sink.name,
        sink_pending=pending,
    )
