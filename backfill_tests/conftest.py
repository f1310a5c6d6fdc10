"""Shared fixtures: a fresh store per test on SQLite and (marker ``pg``) on PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.ingest.importer import import_path
from backfill_assets.ledger.engines import engine_for
from backfill_assets.ledger.run.posts import ImportSummary
from backfill_assets.providersim import SimConfig, Simulator
from backfill_tests.sessions import kill_leftovers
from backfill_tests.stock_dagster import STOCK, stock_template

PG_BASE_URL = os.environ.get(
    "BACKFILL_TEST_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"
)
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


# The drills and the long end-to-end tests: whole processes (the CLI, bin/dev, bin/prod,
# webservers, daemons), SIGKILLs and signals, network cuts, a wheel build, Dagster runs against
# the simulator. Marked slow here, in one list, so `bin/test -m "not slow"` is the fast loop;
# CI runs everything.
DRILLS = {
    "backfill_tests/drills/test_batch_crash.py",
    "backfill_tests/drills/test_celery_hosts.py",
    "backfill_tests/drills/test_celery_workers.py",
    "backfill_tests/dispatch/batch/test_batch_dagster.py",
    "backfill_tests/dispatch/batch/test_batch_hostile.py",
    "backfill_tests/dispatch/batch/test_batch_modes.py",
    "backfill_tests/dispatch/batch/test_batch_money.py",
    "backfill_tests/dispatch/batch/test_batch_pipeline.py",
    "backfill_tests/dispatch/batch/test_batch_sim_hostile.py",
    "backfill_tests/cli/test_bad_settings.py",
    "backfill_tests/cli/test_bin_dev.py",
    "backfill_tests/cli/test_display.py",
    "backfill_tests/cli/test_process.py",
    "backfill_tests/providers/test_hostile_provider.py",
    "backfill_tests/drills/test_http_crash.py",
    "backfill_tests/providers/test_pipeline_sim.py",
    "backfill_tests/providers/test_regions_sim.py",
    "backfill_tests/providers/test_shared_limit_processes.py",
    "backfill_tests/security/test_file_modes.py",
    "backfill_tests/security/test_operator_input.py",
    "backfill_tests/security/test_scan.py",
    "backfill_tests/security/test_webserver.py",
    "backfill_tests/ledger/test_apply.py",
    "backfill_tests/ledger/test_check_pool.py",
    "backfill_tests/browser/test_browser.py",
    "backfill_tests/drills/test_concurrent_runs.py",
    "backfill_tests/drills/test_crash.py",
    "backfill_tests/defs/test_evaluate.py",
    "backfill_tests/drills/test_host_cut.py",
    "backfill_tests/dispatch/test_money_path.py",
    "backfill_tests/cli/test_operator.py",
    "backfill_tests/runner/test_plan.py",
    "backfill_tests/runner/test_policy_upgrade.py",
    "backfill_tests/drills/test_prod_daemon.py",
    "backfill_tests/test_readme.py",
    "backfill_tests/runner/test_run_processes.py",
    "backfill_tests/drills/test_signals.py",
    "backfill_tests/test_wheel.py",
}


def pytest_configure(config: pytest.Config) -> None:
    """The stock-storage pass (``BACKFILL_TEST_DAGSTER=stock``, ``stock_dagster.py``): homes
    the CLI makes in this process get the stock dagster.yaml, not the package's."""
    if STOCK:
        from backfill_assets.runner import instance

        instance.INSTANCE_TEMPLATE = stock_template()  # type: ignore[assignment]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    for item in items:
        if str(Path(str(item.path)).relative_to(root)) in DRILLS:
            item.add_marker(pytest.mark.slow)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The backstop for servers a test started (``backfill_tests/sessions.py``): whatever a
    teardown left running (an interrupted run, a teardown that failed) is killed here, so no
    webserver or daemon outlives the suite. Each xdist worker sweeps its own."""
    leftovers = kill_leftovers()
    if leftovers:
        print(f"\n[sessions] killed {len(leftovers)} process(es) a test left running")


def _pg_admin() -> Engine:
    return sa.create_engine(PG_BASE_URL, isolation_level="AUTOCOMMIT")


@pytest.fixture(scope="session")
def pg_available() -> bool:
    """Whether PostgreSQL answers; under CI=true it must."""
    try:
        with _pg_admin().connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        return True
    except Exception as exc:
        if IN_CI:
            pytest.fail(f"CI=true but PostgreSQL is unreachable at {PG_BASE_URL}: {exc}")
        return False


def make_pg_database(prefix: str = "bf_test") -> str:
    """Create an empty database and return its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with _pg_admin().connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    return sa.engine.make_url(PG_BASE_URL).set(database=name).render_as_string(hide_password=False)


def drop_pg_database(url: str) -> None:
    """Drop a test database, disconnecting leftovers."""
    name = sa.engine.make_url(url).database
    with _pg_admin().connect() as conn:
        conn.execute(
            sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"
                " AND pid <> pg_backend_pid()"
            ),
            {"n": name},
        )
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))


@contextlib.contextmanager
def pg_database(prefix: str = "bf_test") -> Iterator[str]:
    """A fresh database for the block; afterwards its pooled engines are closed and it is
    dropped, leftover sessions included."""
    url = make_pg_database(prefix)
    try:
        yield url
    finally:
        dispose_engine(url)
        drop_pg_database(url)


@pytest.fixture(params=["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty store on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    if not request.getfixturevalue("pg_available"):
        pytest.skip("PostgreSQL not available (set BACKFILL_TEST_PG_URL)")
    with pg_database() as url:
        yield url


def dispose_engine(url: str) -> None:
    """Close the pooled connections of a test store before dropping it."""
    from backfill_assets.ledger.engines import dispose_engine as dispose

    dispose(url)


@pytest.fixture
def engine(store_url: str) -> Engine:
    """A migrated engine for ``store_url``."""
    return engine_for(store_url)


@pytest.fixture
def cli_store(
    engine: Engine, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """Points ``backfill_assets.cli.main`` (which reads os.environ) at this test's migrated
    store and a Dagster home of its own; returns the variables set."""
    env = {"BACKFILL_DATABASE_URL": store_url, "DAGSTER_HOME": str(tmp_path / "home")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def write_jsonl(path: Path, records: list[Any]) -> Path:
    """Write records (dicts as JSON, strings verbatim) as JSONL."""
    with path.open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write((rec if isinstance(rec, str) else json.dumps(rec, ensure_ascii=False)) + "\n")
    return path


def import_records(
    engine: Engine,
    tmp_path: Path,
    records: list[Any],
    name: str = "export.jsonl",
    slice_target: int = 0,
) -> ImportSummary:
    """Import records through the real importer.

    ``slice_target=0`` puts every tenant in all 16 partitions (post -> ``slice_of``), which
    most tests assume; tests of volume-based slicing pass a target.
    """
    return import_path(engine, write_jsonl(tmp_path / name, records), slice_target=slice_target)


StartSim = Callable[..., Simulator]


@pytest.fixture
def sim_defaults() -> dict[str, Any]:
    """Simulator settings every ``start_sim`` call starts from (test packages override it)."""
    return {}


@pytest.fixture
def start_sim(sim_defaults: dict[str, Any]) -> Iterator[StartSim]:
    """Start simulators with keyword config; all are stopped at teardown."""
    started: list[Simulator] = []

    def start(**config: Any) -> Simulator:
        sim = Simulator(SimConfig(**{**sim_defaults, **config})).start()
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()
