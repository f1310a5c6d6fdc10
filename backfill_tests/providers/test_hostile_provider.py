"""The money path against the simulator at its most hostile: over-billing, odd usage
shapes, a wrong key, a bogus Retry-After, 5xx answers that claim the rate window is spent.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from backfill_assets.config.variables import RunSettings
from backfill_assets.dispatch.pipeline import PartitionReport, RunOptions, run_partitions
from backfill_assets.domain.work.outcomes import RetryPolicy
from backfill_assets.ledger.engines import engine_for
from backfill_tests.cli_runs import clean_env, last_json, run_cli
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import refs_for, total, verify
from backfill_tests.providers.conftest import API_KEY, RUBRIC, VERSIONS, AdapterFactory, StartSim

RETRY = RetryPolicy(
    max_attempts=4, retry_base_seconds=0.0, retry_max_seconds=0.0, retry_after_max_seconds=900.0
)


def _records(tenants: list[str], n: int) -> list[dict[str, str]]:
    return [
        {
            "tenant_id": t,
            "post_id": f"p{i:04d}",
            "text": f"{t} {i}: " + "thanks for the quick delivery, five stars " * (1 + i % 4),
        }
        for t in tenants
        for i in range(n)
    ]


def _run(
    engine: Engine, tenants: list[str], make: object, **options: object
) -> list[PartitionReport]:
    return run_partitions(
        engine,
        refs_for(tenants),
        make,  # type: ignore[arg-type]
        VERSIONS,
        RUBRIC,
        f"hostile-{uuid.uuid4().hex[:8]}",
        RunOptions(retry=RETRY, seed=1, **options),  # type: ignore[arg-type]
    )


def _ledger(engine: Engine) -> list[tuple[str, str, int, str]]:
    with engine.connect() as conn:
        return [
            (r.tenant_id, r.key, int(r.tokens_in + r.tokens_out), r.usage_shape)
            for r in conn.exec_driver_sql(
                "SELECT tenant_id, key, tokens_in, tokens_out, usage_shape FROM ledger_events"
                " WHERE type = 'usage'"
            )
        ]


def test_cap_holds_when_the_simulator_bills_three_times_the_estimate(
    engine: Engine, tmp_path: Path, start_sim: StartSim, adapter_for: AdapterFactory
) -> None:
    tenants = ["acme", "globex", "initech"]
    import_records(engine, tmp_path, _records(tenants, 120))
    sim = start_sim(prompt_token_factor=3.0, latency_median_ms=5)
    cap = 20_000
    reports = _run(
        engine,
        tenants,
        adapter_for(sim),
        run=RunSettings(concurrency=64, tenant_budget_tokens=cap),
    )
    ledger = _ledger(engine)
    billed: Counter[str] = Counter()
    for tenant, _key, tokens, _shape in ledger:
        billed[tenant] += tokens
    assert set(billed) == set(tenants) and max(billed.values()) <= cap, billed
    meter = sim.meter.snapshot()
    # The ledger equals the provider's meter, key by key.
    assert sum(billed.values()) == meter.billed_tokens_total
    per_key = {key: tokens for _t, key, tokens, _s in ledger}
    assert per_key == {k: b.total_tokens for k, b in meter.billed_by_correlation_id.items()}
    # The cap binds: keys are left for a later run.
    assert total(reports, "deferred") > 0
    assert sum(r.missing for r in verify(engine, VERSIONS).reports) == total(reports, "deferred")


@pytest.mark.parametrize("shape", ["full", "details_null", "completion_null", "total_only", "none"])
def test_every_usage_shape_bills_one_request_per_key(
    engine: Engine, tmp_path: Path, start_sim: StartSim, adapter_for: AdapterFactory, shape: str
) -> None:
    import_records(engine, tmp_path, _records(["acme"], 40))
    sim = start_sim(usage_shape=shape)
    reports = _run(engine, ["acme"], adapter_for(sim), run=RunSettings(concurrency=8))
    assert total(reports, "accepted") == 40
    meter = sim.meter.snapshot()
    bills = meter.billed_by_correlation_id
    assert len(bills) == 40 and {b.requests for b in bills.values()} == {1}
    ledger = _ledger(engine)
    assert len(ledger) == 40 and len({key for _t, key, _n, _s in ledger}) == 40
    booked = {key: tokens for _t, key, tokens, _s in ledger}
    if shape == "none":
        # Nothing reported: the bound is booked, flagged, and it covers what was billed.
        assert {s for *_x, s in ledger} == {"missing"}
        assert all(booked[k] >= b.total_tokens for k, b in bills.items())
    else:
        assert booked == {k: b.total_tokens for k, b in bills.items()}
    assert verify(engine, VERSIONS).as_dict(require_complete=True)["ok"]


def test_bogus_retry_after_and_5xx_reset_headers_do_not_park_the_run(
    engine: Engine, tmp_path: Path, start_sim: StartSim, adapter_for: AdapterFactory
) -> None:
    import_records(engine, tmp_path, _records(["acme"], 30))
    sim = start_sim(
        retry_after_format="huge",
        reset_headers_on_5xx=True,
        faults=[{"kind": "429", "rate": 0.2}, {"kind": "503", "rate": 0.2}],
        seed=7,
    )
    started = time.monotonic()
    reports = run_partitions(
        engine,
        refs_for(["acme"]),
        adapter_for(sim, retry_after_max_seconds=0.5),
        VERSIONS,
        RUBRIC,
        "hostile-retry-after",
        RunOptions(
            run=RunSettings(concurrency=4),
            retry=RetryPolicy(
                max_attempts=8,
                retry_base_seconds=0.01,
                retry_max_seconds=0.05,
                retry_after_max_seconds=0.5,
            ),
            seed=1,
        ),
    )
    assert time.monotonic() - started < 60
    assert total(reports, "accepted") + total(reports, "retry_exhausted") == 30
    assert sum(r.stats.retry_after_capped for r in reports) > 0


def test_wrong_key_stops_the_run_then_the_right_key_completes(
    tmp_path: Path, start_sim: StartSim
) -> None:
    sim = start_sim(api_key=API_KEY, latency_median_ms=20)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    concurrency = 8
    env = clean_env(
        DAGSTER_HOME=str(tmp_path / "dagster_home"),
        BACKFILL_DATABASE_URL=url,
        BACKFILL_CONCURRENCY=str(concurrency),
        BACKFILL_MODEL_BACKEND="openai",
        BACKFILL_MODEL_BASE_URL=sim.base_url,
        BACKFILL_MODEL_API_KEY="sk-wrong-0123456789abcdef",
    )
    engine = engine_for(url)
    import_records(engine, tmp_path, _records(["acme"], 60))
    started = time.monotonic()
    refused = run_cli(["run", "--json"], env)
    elapsed = time.monotonic() - started
    assert refused.returncode != 0 and elapsed < 60
    output = refused.stdout + refused.stderr
    assert "HTTP 401" in output and sim.base_url in output
    assert "sk-wrong-0123456789abcdef" not in output and "0123456789abcdef" not in output
    meter = sim.meter.snapshot()
    assert 1 <= meter.refusals_by_status.get(401, 0) <= concurrency
    with engine.connect() as conn:
        dead = conn.exec_driver_sql("SELECT count(*) FROM dead_letters").scalar_one()
        stored = " ".join(
            str(m) for (m,) in conn.exec_driver_sql("SELECT message FROM ledger_events")
        )
    assert dead == 0 and "0123456789abcdef" not in stored
    fixed = run_cli(["run", "--json"], {**env, "BACKFILL_MODEL_API_KEY": API_KEY})
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    done = run_cli(["verify", "--require-complete", "--json"], env)
    assert done.returncode == 0 and last_json(done.stdout)["ok"]
