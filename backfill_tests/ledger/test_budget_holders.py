"""Budget reservations: held while their holder lives, however long it is silent;
reclaimed the moment it dies; and no holder can hoard a tenant's whole budget."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.config.variables import RunSettings
from backfill_assets.dispatch.pipeline import PartitionReport, RunOptions, run_partitions
from backfill_assets.domain.money.budgets import Spend, TenantBudgets
from backfill_assets.domain.policy.rubric import call_token_bound
from backfill_assets.ledger.spend.budget import StoreBudgetLedger
from backfill_assets.ledger.spend.budget_holders import HolderLost
from backfill_assets.providers.models.fake import FakeModel
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import FAST_RETRY, RUBRIC, VERSIONS, refs_for

_HOLDER = """
import sys, time
from backfill_assets.ledger.engines import engine_for
from backfill_assets.domain.money.budgets import Spend
from backfill_assets.ledger.spend.budget_holders import HolderLost
from backfill_assets.ledger.spend.budget import StoreBudgetLedger
ledger = StoreBudgetLedger(engine_for(sys.argv[1]), holder="doomed-run")
ledger.grant("acme", "r-doomed", Spend(1000), Spend(1000), 3000)
print("granted", flush=True)
time.sleep(120)
"""


def _posts(engine: Engine, tmp_path: Path, n: int = 1) -> list[dict[str, str]]:
    data = [
        {"tenant_id": "acme", "post_id": f"p{i:03d}", "text": f"post {i} about shipping"}
        for i in range(n)
    ]
    import_records(engine, tmp_path, data)
    return data


def _reserved(engine: Engine, reservation_id: str) -> int | None:
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT tokens FROM budget_reservations WHERE reservation_id = :r"),
            {"r": reservation_id},
        ).scalar_one_or_none()


def _wait_until_the_server_drops_its_session(engine: Engine) -> None:
    """PostgreSQL ends a dead client's backend (and its advisory lock) a moment after the
    process is reaped: CI once granted in that moment. Wait for the server, not the client."""
    if engine.dialect.name != "postgresql":
        return  # the OS drops an flock with the process
    held = sa.text(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid <> pg_backend_pid()"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    deadline = time.monotonic() + 10.0
    with engine.connect() as conn:
        while conn.execute(held).scalar_one():
            assert time.monotonic() < deadline, "the server kept a dead holder's lock for 10 s"
            time.sleep(0.01)


def test_a_reservation_lives_exactly_as_long_as_its_holder(
    engine: Engine, store_url: str, tmp_path: Path
) -> None:
    _posts(engine, tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, store_url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "granted"
        # Silent for two hours (a paused process, a slow poll): its money is still live.
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE budget_reservations SET heartbeat_at = '2000-01-01'"))
        other = StoreBudgetLedger(engine, holder="other-run")
        grant = other.grant("acme", "r-other", Spend(3000), Spend(100), 3000)
        assert _reserved(engine, "r-doomed") == 1000
        assert grant.granted is not None
        assert grant.granted.tokens + grant.free_after.tokens == 2000
        other.release(["r-other"])
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    _wait_until_the_server_drops_its_session(engine)
    # Dead: the next grant reclaims its reservation at once, not minutes later.
    grant = StoreBudgetLedger(engine, holder="third-run").grant(
        "acme", "r-third", Spend(100), Spend(100), 3000
    )
    assert _reserved(engine, "r-doomed") is None
    assert grant.granted is not None
    assert grant.granted.tokens + grant.free_after.tokens == 3000


def test_a_lost_lock_connection_is_noticed_at_the_next_grant(
    engine: Engine, tmp_path: Path
) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("flock and in-memory locks live as long as the process")
    _posts(engine, tmp_path)
    ledger = StoreBudgetLedger(engine, holder="fragile-run")
    ledger.grant("acme", "r-fragile", Spend(100), Spend(100), 3000)
    with engine.connect() as conn:
        # The server drops the session that holds the lock (a restart, an idle timeout).
        conn.execute(
            sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                " AND pid <> pg_backend_pid()"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
        )
    with pytest.raises(HolderLost):
        ledger.grant("acme", "r-fragile", Spend(100), Spend(100), 3000)
    ledger.release(["r-fragile"])


def test_no_holder_can_hoard_the_tenants_budget(engine: Engine, tmp_path: Path) -> None:
    _posts(engine, tmp_path)
    cap = 1600

    async def both() -> tuple[bool, bool]:
        a = TenantBudgets(cap, StoreBudgetLedger(engine, holder="a"), chunk_calls=32)
        b = TenantBudgets(cap, StoreBudgetLedger(engine, holder="b"), chunk_calls=32)
        got_a = await a.reserve("acme", Spend(100))
        got_b = await b.reserve("acme", Spend(100))
        await a.release()
        await b.release()
        return got_a is not None, got_b is not None

    assert asyncio.run(both()) == (True, True)


def test_two_concurrent_runs_of_one_tenant_both_get_work(engine: Engine, tmp_path: Path) -> None:
    data = _posts(engine, tmp_path, 160)
    bound = max(
        call_token_bound(RUBRIC, "k" * 64, r["text"]) for r in data
    )  # keys are 64 hex characters
    cap = 24 * bound
    barrier = threading.Barrier(2)
    results: dict[str, list[PartitionReport]] = {}

    def run(name: str, slices: range) -> None:
        model = FakeModel(model=VERSIONS.model, latency_ms=40)
        barrier.wait()
        results[name] = run_partitions(
            engine,
            refs_for(["acme"], slices),
            lambda: model,
            VERSIONS,
            RUBRIC,
            f"run-{name}",
            RunOptions(run=RunSettings(concurrency=16, tenant_budget_tokens=cap), retry=FAST_RETRY),
        )

    threads = [
        threading.Thread(target=run, args=("a", range(0, 8))),
        threading.Thread(target=run, args=("b", range(8, 16))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    accepted = {n: sum(r.stats.outcomes["accepted"] for r in reps) for n, reps in results.items()}
    assert accepted["a"] > 0 and accepted["b"] > 0, accepted
    with engine.connect() as conn:
        billed = conn.execute(sa.text("SELECT billed_tokens FROM tenants")).scalar_one()
    assert 0 < billed <= cap
