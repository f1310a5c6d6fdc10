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
from backfill_assets.store.partition_counts import post_counts
from backfill_assets.store.partition_groups import Owners, claimed_by, claims, grouped
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
    conn: Connection, scopes: Sequence[Scope], versions: Versions
) -> dict[str, PartitionEvidence]:
    """Each partition's posts and every row that claims it *or* carries one of its keys, for
    all of ``scopes`` (by partition key) in five queries: rows are routed to the partition
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
    owners = {(sc.tenant_id, s): sc.key for sc in scopes for s in sc.slices}
    if not owners:
        return {sc.key: _no_evidence(sc, versions) for sc in scopes}
    slice_posts: dict[str, dict[str, str]] = {sc.key: {} for sc in scopes}
    expected: dict[str, dict[str, str]] = {sc.key: {} for sc in scopes}
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
        got: dict[str, list[Row]] = {sc.key: [] for sc in scopes}
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

    ledger: dict[str, list[Row]] = {sc.key: [] for sc in scopes}
    for row in _ledger(conn, claimed_by(ledger_events, owners)):
        claim = owners.get((row["tenant_id"], row["slice"]))
        if claim is not None:
            ledger[claim].append(row)
    result_rows, dead = gather(results), gather(dead_letters)
    return {
        sc.key: PartitionEvidence(
            tenant=sc.tenant_id,
            slice=sc.slice,
            versions=versions,
            posts=slice_posts[sc.key],
            results=result_rows[sc.key],
            dead=dead[sc.key],
            ledger=ledger[sc.key],
            expected_keys=expected[sc.key],
        )
        for sc in scopes
    }


def _no_evidence(scope: Scope, versions: Versions) -> PartitionEvidence:
    """A partition that holds no stored slice (too few posts to split this far)."""
    return PartitionEvidence(
        tenant=scope.tenant_id,
        slice=scope.slice,
        versions=versions,
        posts={},
        results=[],
        dead=[],
        ledger=[],
        expected_keys={},
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
    """Each partition's verdicts: rows read for a group of partitions at once
    (``partition_groups``), the stored-result schema validated in one frame per batch.

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
        sizes = post_counts(conn, sorted({sc.tenant_id for sc in scopes}))
        for group in grouped(
            scopes, lambda sc: sum(sizes.get((sc.tenant_id, s), 0) for s in sc.slices)
        ):
            found = evidence_of(conn, group, judging.versions)
            for scope in group:
                ev = found[scope.key]
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
