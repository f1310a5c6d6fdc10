"""The usage rollup (sql/008): reports read it instead of aggregating the whole
ledger, so it must equal the ledger's usage events grouped by tenant, model and UTC day, after
every kind of outcome, after a migration of an existing store, and `verify` must say when not."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.ledger.migrate import migrate
from backfill_assets.ledger.run.usage import usage_by_day, usage_by_tenant_model
from backfill_assets.providers.models.fake import FakeModel
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import run, verify


def _posts(tenants: list[str], n: int) -> list[dict[str, str]]:
    return [
        {"tenant_id": t, "post_id": f"p{i:03d}", "text": f"{t} post {i}: ünïcödé " * (1 + i % 4)}
        for t in tenants
        for i in range(n)
    ]


def _from_ledger(engine: Engine) -> list[tuple[str, str, str, int, int, int, int]]:
    """The ledger's usage events grouped as the rollup should be, written independently."""
    day = "date(at)" if engine.dialect.name == "sqlite" else "to_char(at, 'YYYY-MM-DD')"
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            f"SELECT tenant_id, model, {day}, count(*), sum(tokens_in), sum(tokens_out),"
            f" sum(cost_nanos) FROM ledger_events WHERE type = 'usage'"
            f" GROUP BY tenant_id, model, {day} ORDER BY 1, 2, 3"
        ).all()
    return [(t, m, str(d), int(c), int(i), int(o), int(x)) for t, m, d, c, i, o, x in rows]


def _from_rollup(engine: Engine) -> list[tuple[str, str, str, int, int, int, int]]:
    with engine.connect() as conn:
        return [
            (
                str(r["tenant"]),
                str(r["model"]),
                str(r["day"]),
                int(str(r["calls"])),
                int(str(r["tokens_in"])),
                int(str(r["tokens_out"])),
                int(str(r["cost_nanos"])),
            )
            for r in usage_by_day(conn)
        ]


def _run_hostile(engine: Engine, tmp_path: Path) -> None:
    """Retries, malformed answers, and every usage shape a provider sends."""
    import_records(engine, tmp_path, _posts(["acme", "globex", "initech"], 40))
    run(engine, ["acme"], FakeModel(failure_rate=0.3, malformed_rate=0.2, usage_shape="split"))
    run(engine, ["globex"], FakeModel(failure_rate=0.2, usage_shape="total", overbill_factor=1.3))
    run(engine, ["initech"], FakeModel(usage_shape="missing"))
    run(engine, ["acme", "globex", "initech"])  # what the first runs left


def test_the_rollup_is_the_ledger_grouped_by_tenant_model_and_day(
    engine: Engine, tmp_path: Path
) -> None:
    _run_hostile(engine, tmp_path)
    expected = _from_ledger(engine)
    assert {t for t, *_ in expected} == {"acme", "globex", "initech"}
    # Every key billed once: a refused call bills nothing, a malformed answer still bills.
    assert sum(c for *_, c, _i, _o, _x in expected) == 120
    with engine.connect() as conn:
        rejected = conn.exec_driver_sql(
            "SELECT count(*) FROM dead_letters WHERE outcome = 'schema_rejected'"
        ).scalar_one()
    assert rejected > 0
    assert _from_rollup(engine) == expected
    with engine.connect() as conn:
        totals = usage_by_tenant_model(conn)
    assert [(r["tenant"], r["calls"]) for r in totals] == [(t, c) for t, _m, _d, c, *_ in expected]
    assert not [p for p in verify(engine).problems if p.kind == "usage_rollup"]


def test_migrating_an_existing_store_books_its_ledger_into_the_rollup(
    engine: Engine, tmp_path: Path
) -> None:
    _run_hostile(engine, tmp_path)
    with engine.begin() as conn:  # the fake bills nothing; give the calls a price
        conn.exec_driver_sql("UPDATE ledger_events SET cost_nanos = tokens_in * 150 + tokens_out")
    expected = _from_ledger(engine)
    # A store from before sql/008 (and 012, 014, 015): the same ledger with its float cost, no
    # rollup, no tiers, no dollar budgets.
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE usage_daily")
        conn.exec_driver_sql("DELETE FROM schema_migrations WHERE version IN (8, 12, 14, 15)")
        for table, column in [
            ("tenants", "budget_tokens"),
            ("tenants", "budget_nanos"),
            ("tenants", "billed_nanos"),
            ("budget_reservations", "nanos"),
            ("batch_submissions", "reserved_nanos"),
            ("batch_lines", "bound_nanos"),
        ]:
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN {column}")
        for column in ("service_tier", "price_booked", "cost_unknown", "tokens_reasoning"):
            conn.exec_driver_sql(f"ALTER TABLE ledger_events DROP COLUMN {column}")
        conn.exec_driver_sql("UPDATE ledger_events SET tokens_cached = tokens_in / 3")
        conn.exec_driver_sql(
            "ALTER TABLE ledger_events ADD COLUMN cost DOUBLE PRECISION NOT NULL DEFAULT 0"
        )
        conn.exec_driver_sql("UPDATE ledger_events SET cost = cost_nanos / 1000000000.0")
        conn.exec_driver_sql("ALTER TABLE ledger_events DROP COLUMN cost_nanos")
    assert migrate(engine) == [8, 12, 14, 15]
    assert _from_rollup(engine) == expected
    # sql/015 books each tenant's cost so far as billed: a dollar cap counts it.
    with engine.connect() as conn:
        billed = dict(conn.exec_driver_sql("SELECT tenant_id, billed_nanos FROM tenants").all())
        booked = dict(
            conn.exec_driver_sql(
                "SELECT tenant_id, sum(cost_nanos) FROM ledger_events WHERE type = 'usage'"
                " GROUP BY tenant_id"
            ).all()
        )
    assert billed == {t: int(booked.get(t, 0)) for t in billed} and sum(booked.values()) > 0
    # sql/014 books the cached tokens the ledger already held into the rollup.
    day = "date(at)" if engine.dialect.name == "sqlite" else "to_char(at, 'YYYY-MM-DD')"
    with engine.connect() as conn:
        cached = conn.exec_driver_sql(
            f"SELECT tenant_id, model, {day}, sum(tokens_cached) FROM ledger_events"
            f" WHERE type = 'usage' GROUP BY tenant_id, model, {day} ORDER BY 1, 2, 3"
        ).all()
        rolled = [
            (r["tenant"], r["model"], r["day"], r["tokens_cached"]) for r in usage_by_day(conn)
        ]
    assert [(t, m, str(d), int(c)) for t, m, d, c in cached] == rolled
    assert sum(c for *_, c in rolled) > 0
    assert verify(engine).as_dict()["ok"]


@pytest.mark.parametrize(
    "tamper",
    [
        "UPDATE usage_daily SET calls = calls + 1 WHERE tenant_id = 'globex'",
        "UPDATE usage_daily SET tokens_out = tokens_out - 7 WHERE tenant_id = 'globex'",
        "DELETE FROM usage_daily WHERE tenant_id = 'globex'",
        "INSERT INTO usage_daily VALUES ('globex', 'other', '2026-01-01', 1, 10, 5, 100, 0, 0)",
        "UPDATE usage_daily SET tenant_id = 'acme' WHERE tenant_id = 'globex'",
    ],
)
def test_verify_fails_when_the_rollup_and_the_ledger_disagree(
    engine: Engine, tmp_path: Path, tamper: str
) -> None:
    import_records(engine, tmp_path, _posts(["acme", "globex"], 10))
    run(engine, ["acme", "globex"])
    assert verify(engine).as_dict()["ok"]
    with engine.begin() as conn:
        if "SET tenant_id" in tamper:
            # Merge rather than collide on the key: acme's day row absorbs globex's.
            conn.exec_driver_sql(
                "UPDATE usage_daily SET calls = calls + (SELECT sum(calls) FROM usage_daily"
                " WHERE tenant_id = 'globex') WHERE tenant_id = 'acme'"
            )
            conn.exec_driver_sql("DELETE FROM usage_daily WHERE tenant_id = 'globex'")
        else:
            conn.exec_driver_sql(tamper)
    doc = verify(engine).as_dict()
    assert not doc["ok"]
    found = [p for p in doc["problems"] if p["kind"] == "usage_rollup"]
    assert found and {p["table"] for p in found} == {"usage_daily"}
    assert "globex" in {p["tenant"] for p in found}


def test_a_flush_books_usage_and_rollup_in_one_transaction(engine: Engine, tmp_path: Path) -> None:
    """A flush that fails after the events were written leaves neither (no drift to repair)."""
    import_records(engine, tmp_path, _posts(["acme"], 5))
    with engine.begin() as conn:
        # The rollup refuses new rows: the flush's upsert fails inside its transaction.
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql(
                "CREATE TRIGGER no_usage BEFORE INSERT ON usage_daily"
                " BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
        else:
            conn.exec_driver_sql(
                "ALTER TABLE usage_daily ADD CONSTRAINT refused CHECK (calls < 0) NOT VALID"
            )
    with pytest.raises(Exception, match="refused"):
        run(engine, ["acme"])
    with engine.connect() as conn:
        booked = conn.execute(
            sa.text("SELECT count(*) FROM ledger_events WHERE type = 'usage'")
        ).scalar_one()
    assert booked == 0
    assert _from_rollup(engine) == []
