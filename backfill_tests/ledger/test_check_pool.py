"""Big runs are checked by worker processes: the same check results as in-process, on both stores,
and a failing worker costs time, never a check result."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.config.variables import ChecksSettings
from backfill_assets.defs.labels.checks import check_results_for_many
from backfill_assets.dispatch.pipeline import with_levels
from backfill_assets.domain.checks.catalog import CheckResult
from backfill_assets.ledger.evidence import check_pool
from backfill_tests.moderation_helpers import busiest, execute, load, one_key
from backfill_tests.pipeline_helpers import RUBRIC, VERSIONS, refs_for, run

TENANTS = {"acme": 300, "globex": 200, "initech": 100}


@pytest.fixture
def tampered(engine: Engine, tmp_path: Path) -> Engine:
    """Three labelled tenants; one acme result relabelled to globex (isolation fails)."""
    load(engine, tmp_path, TENANTS, spam_every=7)
    run(engine, list(TENANTS))
    ref = busiest(engine, "acme")
    execute(
        engine, "UPDATE results SET tenant_id = 'globex' WHERE key = :k", k=one_key(engine, ref)
    )
    return engine


def checked(
    engine: Engine, pooling: check_pool.Pooling | None = None
) -> tuple[dict[str, list[CheckResult]], list[str]]:
    """Every partition's check results, and what the checks logged."""
    refs = with_levels(engine, refs_for(TENANTS))
    logged: list[str] = []
    out = check_results_for_many(
        engine, refs, VERSIONS, RUBRIC, ChecksSettings(), log=logged.append, pooling=pooling
    )
    return out, logged


# Even this small store goes to two workers, in chunks of 50 posts.
SMALL_RUNS = check_pool.Pooling(min_posts=0, chunk_posts=50, workers=2)


def test_workers_give_the_same_check_results_as_one_process(tampered: Engine) -> None:
    serial, _ = checked(tampered)
    pooled, logged = checked(tampered, dataclasses.replace(SMALL_RUNS, progress_every_s=0.0))
    assert any("worker processes" in m for m in logged)
    assert any("partition(s) checked" in m for m in logged)
    assert not any("failed" in m for m in logged)
    assert pooled == serial
    failed = {(pk, v.name) for pk, vs in pooled.items() for v in vs if not v.passed}
    assert {name for _pk, name in failed} == {"isolation"}
    assert {pk.split("|")[1] for pk, _n in failed} == {"acme", "globex"}


def test_a_failing_worker_falls_back_to_this_process(tampered: Engine) -> None:
    serial, _ = checked(tampered)
    dying = (sys.executable, "-c", "import sys; sys.exit(3)")
    fallback, logged = checked(tampered, dataclasses.replace(SMALL_RUNS, command=dying))
    assert fallback == serial
    assert any("failed" in m for m in logged)


def test_small_runs_stay_in_process(tampered: Engine) -> None:
    refs = with_levels(tampered, refs_for(TENANTS))
    from backfill_assets.ledger.evidence.evidence import Partition
    from backfill_assets.ledger.run.partition_counts import post_counts

    partitions = [Partition(r.key, r.tenant_id, r.slice, r.slices) for r in refs]
    with tampered.connect() as conn:
        counts = post_counts(conn, sorted({r.tenant_id for r in refs}))
    assert check_pool.plan(partitions, counts) is None  # 600 posts: not worth a process


def test_the_checks_read_every_row_as_stored(tampered: Engine) -> None:
    # On SQLite the checks read rows straight from the driver: the same rows, columns and
    # values (None, floats, integers) as SQLAlchemy reads, on both stores. The partition's
    # results include the one relabelled to globex (fetched by its expected key).
    import sqlalchemy as sa

    from backfill_assets.ledger.evidence.evidence import Partition, evidence_of
    from backfill_assets.ledger.tables import dead_letters, ledger_events, results

    ref = with_levels(tampered, [busiest(tampered, "acme")])[0]
    with tampered.connect() as conn:
        part = Partition(ref.key, ref.tenant_id, ref.slice, ref.slices)
        ev = evidence_of(conn, [part], VERSIONS)[ref.key]
        for table, got, order in (
            (results, ev.results, "key"),
            (dead_letters, ev.dead, "key"),
            (ledger_events, ev.ledger, "id"),
        ):
            names = list(got[0].keys()) if got else []
            where = sa.and_(table.c.tenant_id == ref.tenant_id, table.c.slice.in_(ref.slices))
            if table is not ledger_events:  # also rows that carry one of its keys
                where = sa.or_(where, table.c.key.in_(list(ev.expected_keys.values())))
            stmt = sa.select(*(table.c[n] for n in names)).where(where).order_by(table.c[order])
            expected = [dict(r) for r in conn.execute(stmt).mappings()] if names else []
            assert [dict(zip(names, (r[n] for n in names), strict=True)) for r in got] == expected
    assert ev.results and ev.ledger
    assert any(r["tenant_id"] == "globex" for r in ev.results)
    assert any(r["usage_shape"] is None for r in ev.ledger)  # attempts carry no usage shape
    assert all(isinstance(r["confidence"], float) for r in ev.results)


def _plain(ev: object) -> dict[str, object]:
    """Evidence with rows as dicts (the drivers' row types compare by identity or type)."""
    rows = ("results", "dead", "ledger")
    doc = {f.name: getattr(ev, f.name) for f in dataclasses.fields(ev)}  # type: ignore[arg-type]
    return {**doc, **{name: [dict(r) for r in doc[name]] for name in rows}}


def test_a_group_read_finds_what_each_partition_read_finds(tampered: Engine) -> None:
    # Many small partitions are read in one query per table, with the same rows as each
    # partition read alone; rows are routed back by their
    # (tenant, slice) and, when they carry a partition's key while claiming elsewhere, to that
    # partition too: inside the group (acme's result relabelled to globex), outside it (one
    # relabelled to a tenant not in the group) and to a slice of a group tenant that no
    # partition of the group holds (initech's slice 5: the group holds its slice 0 only).
    from backfill_assets.ledger.evidence.evidence import Partition, evidence_of

    with tampered.connect() as conn:
        keys = conn.execute(
            sa.text("SELECT key FROM results WHERE tenant_id = 'acme' ORDER BY key LIMIT 2")
        ).scalars()
        moved = dict(zip(keys, (("elsewhere", 0), ("initech", 5)), strict=True))
    for key, (tenant, slice_no) in moved.items():
        execute(
            tampered,
            "UPDATE results SET tenant_id = :t, slice = :s WHERE key = :k",
            t=tenant,
            s=slice_no,
            k=key,
        )
    refs = with_levels(tampered, refs_for(["acme", "globex"]))
    partitions = [Partition(r.key, r.tenant_id, r.slice, r.slices) for r in refs]
    partitions.append(Partition("s00|initech", "initech", 0, (0,)))
    with tampered.connect() as conn:
        group = evidence_of(conn, partitions, VERSIONS)
        alone = {part.key: evidence_of(conn, [part], VERSIONS)[part.key] for part in partitions}
    assert {k: _plain(ev) for k, ev in group.items()} == {k: _plain(ev) for k, ev in alone.items()}
    foreign = [r for ev in group.values() for r in ev.results if r["tenant_id"] != ev.tenant]
    assert {r["tenant_id"] for r in foreign} == {"globex", "elsewhere", "initech"}
