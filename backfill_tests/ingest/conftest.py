"""Stores shared by a module's tests (emptied between tests): creating and migrating a
PostgreSQL database per test would cost more than the tests themselves."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.ingest.importer import import_path
from backfill_assets.ledger.engines import engine_for
from backfill_tests.conftest import pg_database
from backfill_tests.ingest.exports import RECORDS, counts, rejects, stored, write_jsonl

# Every table an import writes, emptied before each test.
IMPORT_TABLES = ("posts", "tenants", "rejected_records", "import_sources")


@pytest.fixture(scope="module", params=["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
def module_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One store per module and backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('store') / 'store.db'}"
        return
    if not request.getfixturevalue("pg_available"):
        pytest.skip("PostgreSQL not available (set BACKFILL_TEST_PG_URL)")
    with pg_database() as url:
        yield url


@pytest.fixture
def engine(module_store: str) -> Engine:
    """The module's store on each backend, empty."""
    eng = engine_for(module_store)
    with eng.begin() as conn:
        for table in IMPORT_TABLES:
            conn.execute(sa.text(f"DELETE FROM {table}"))
    return eng


@pytest.fixture
def lite(tmp_path: Path) -> Engine:
    """A fresh SQLite store: for what the reader decides, whichever store it writes to."""
    return engine_for(f"sqlite:///{tmp_path / 'lite.db'}")


@pytest.fixture(scope="module")
def jsonl_truth(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, object], list[Any], list[Any]]:
    """What the JSONL import of RECORDS gives, on a SQLite store of its own."""
    work = tmp_path_factory.mktemp("truth")
    engine = engine_for(f"sqlite:///{work / 'truth.db'}")
    got = import_path(engine, write_jsonl(work / "posts.jsonl", RECORDS, {}), slice_target=0)
    return counts(got), stored(engine), [(reason, t) for _, reason, t in rejects(engine)]
