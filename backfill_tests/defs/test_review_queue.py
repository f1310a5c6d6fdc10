"""The UI's ``review_queue`` asset: posts waiting for a person per tenant, the total, and the
age of the oldest, counted as ``review export`` writes them."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.definitions import build_definitions
from backfill_assets.defs.reporting.review_queue import age_text
from backfill_assets.ledger.tables import applied_labels, utcnow
from backfill_tests.policy_helpers import COURSE_V5
from backfill_tests.review_helpers import decide, labelled_store


def _materialise(store_url: str, tmp_path: Path) -> dict[str, Any]:
    env = {
        "BACKFILL_DATABASE_URL": store_url,
        "DAGSTER_HOME": str(tmp_path / "home"),
        "BACKFILL_POLICY_PATH": str(COURSE_V5),
    }
    defs = build_definitions(env)
    with dg.instance_for_test() as instance:
        assert dg.materialize([defs.resolve_assets_def("review_queue")], instance=instance).success
        record = instance.fetch_materializations(dg.AssetKey("review_queue"), limit=1).records[0]
        mat = record.event_log_entry.asset_materialization
        assert mat is not None
        return {k: v.value for k, v in mat.metadata.items()}


def test_the_queue_per_tenant_its_total_and_the_oldest_wait(
    engine: Engine, store_url: str, tmp_path: Path
) -> None:
    rubric = labelled_store(engine, tmp_path)
    # learn: formula and rev-0..2 queued; code-club: rev-0..1. A decision takes one out.
    decide(engine, rubric, "learn", "rev-2", "ok")
    # One of code-club's queued labels applied two days and an hour ago.
    long_ago = utcnow() - dt.timedelta(days=2, hours=1)
    al = applied_labels
    with engine.begin() as conn:
        conn.execute(
            al.update()
            .where(al.c.tenant_id == "code-club", al.c.post_id == "rev-0")
            .values(applied_at=long_ago)
        )
    meta = _materialise(store_url, tmp_path)
    assert meta["queued"] == 5 and meta["tenants"] == 2
    assert 2 * 86_400 + 3_600 <= meta["oldest_age_seconds"] < 2 * 86_400 + 3_600 + 600
    assert meta["oldest_age"] == "2d 1h"
    assert meta["oldest_applied_at"] == long_ago.isoformat(timespec="seconds") + "Z"
    table = meta["queue"].splitlines()
    # The tenants with the most queued first, each with its own oldest wait.
    assert table[2].startswith("| learn | 3 | ") and table[3] == "| code-club | 2 | 2d 1h |"
    assert meta["review_labels"] == "needs_review" and meta["policy_id"] == "course-rubric"
    # A human label in force is never counted, whatever its label.
    with engine.begin() as conn:
        conn.execute(sa.update(al).where(al.c.tenant_id == "learn").values(source="human"))
    meta = _materialise(store_url, tmp_path)
    assert meta["queued"] == 2 and meta["tenants"] == 1


def test_an_empty_queue_is_a_report_of_zeros(
    engine: Engine, store_url: str, tmp_path: Path
) -> None:
    meta = _materialise(store_url, tmp_path)
    assert meta["queued"] == 0 and meta["tenants"] == 0
    assert meta["oldest_age_seconds"] == 0.0 and meta["oldest_age"] == "-"
    assert "(nothing to review)" in meta["queue"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59, "59s"), (60, "1m"), (3_661, "1h 1m"), (90_000, "1d 1h"), (-5, "0s")],
)
def test_an_age_reads_as_a_wait(seconds: float, text: str) -> None:
    assert age_text(seconds) == text
