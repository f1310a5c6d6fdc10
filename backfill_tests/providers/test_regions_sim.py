"""Region lanes against two simulators: a tenant's requests reach only its region's endpoint.

``acme`` has no region (the default endpoint), ``euco`` is in ``eu`` (its own simulator and
key), ``apco`` is in ``ap``, which has no endpoint: nothing is sent anywhere for it, its
partitions fail naming the region, and the others complete.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.config.variables import HttpSettings, ModelSettings, RunSettings
from backfill_assets.defs.model_resources import OpenAIModelResource
from backfill_assets.dispatch.pipeline import RegionUnavailable, RunOptions, run_partitions
from backfill_assets.domain.policy.rubric import TASK_VERSION, Rubric
from backfill_assets.domain.work.keys import SLICE_KEYS, Versions, content_hash, work_key
from backfill_assets.ledger.engines import engine_for
from backfill_assets.providersim import Simulator
from backfill_tests.cli_runs import clean_env, last_json, run_cli
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import FAST_RETRY, refs_for
from backfill_tests.providers.conftest import MODEL, StartSim

DEFAULT_KEY = "sk-default-7c2e9a41d0b3f5e6"
EU_KEY = "sk-eu-3f8d1b6a9c0e2d4f"
TENANTS = {"acme": None, "euco": "eu", "apco": "ap"}
POSTS = 12
VERSIONS = Versions(TASK_VERSION, Rubric().key_version, MODEL)


def _records() -> list[dict[str, Any]]:
    out = []
    for tenant, region in TENANTS.items():
        for i in range(POSTS):
            rec: dict[str, Any] = {
                "tenant_id": tenant,
                "post_id": f"p{i:02d}",
                "text": f"{tenant} says hello #{i}",
            }
            if region is not None and i == 0:
                rec["region"] = region  # the first line names the tenant's region
            out.append(rec)
    return out


def _keys(tenant: str) -> set[str]:
    return {
        work_key(VERSIONS, r["tenant_id"], r["post_id"], content_hash(r["text"]))
        for r in _records()
        if r["tenant_id"] == tenant
    }


@pytest.fixture
def sims(start_sim: StartSim) -> tuple[Simulator, Simulator]:
    """The default endpoint and the EU one, each accepting only its own key."""
    return start_sim(api_key=DEFAULT_KEY), start_sim(api_key=EU_KEY)


def _assert_routed(default: Simulator, eu: Simulator) -> None:
    d, e = default.meter.snapshot(), eu.meter.snapshot()
    assert set(d.calls_by_correlation_id) == set(d.billed_by_correlation_id) == _keys("acme")
    assert set(e.calls_by_correlation_id) == set(e.billed_by_correlation_id) == _keys("euco")
    # Nothing for apco reached either simulator, and no request was refused for a wrong key.
    assert d.refusals_by_status == {} and e.refusals_by_status == {}
    assert d.requests_total == e.requests_total == POSTS


def _env(store_url: str, home: Path, default: Simulator, eu: Simulator) -> dict[str, str]:
    return clean_env(
        BACKFILL_MODEL_BACKEND="openai",
        BACKFILL_DATABASE_URL=store_url,
        DAGSTER_HOME=str(home),
        BACKFILL_MODEL_BASE_URL=default.base_url,
        BACKFILL_MODEL_API_KEY=DEFAULT_KEY,
        BACKFILL_MODEL_BASE_URL__EU=eu.base_url,
        BACKFILL_MODEL_API_KEY__EU=EU_KEY,
        BACKFILL_RPM="6000",
        BACKFILL_MAX_ATTEMPTS="3",
        BACKFILL_RETRY_BASE_SECONDS="0.01",
    )


def test_the_cli_run_routes_each_tenant_to_its_region_and_fails_closed_for_ap(
    tmp_path: Path, sims: tuple[Simulator, Simulator]
) -> None:
    default, eu = sims
    url = f"sqlite:///{tmp_path / 'store.db'}"
    import_records(engine_for(url), tmp_path, _records())
    home = tmp_path / "home"
    env = _env(url, home, default, eu)

    done = run_cli(["run", "--json"], env, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    doc = last_json(done.stdout)
    runs = {r["run_id"]: r for r in doc["runs"]}
    instance = dg.DagsterInstance.from_config(str(home))
    by_tenant = {
        instance.get_run_by_id(rid).tags["tenant"]: r  # type: ignore[union-attr]
        for rid, r in runs.items()
        if r["job"] == "moderation_backfill"
    }
    assert by_tenant["acme"]["success"] and by_tenant["euco"]["success"]
    assert not by_tenant["apco"]["success"]
    assert "no endpoint for region 'ap'" in by_tenant["apco"]["error"]
    assert "BACKFILL_MODEL_BASE_URL__AP" in by_tenant["apco"]["error"]
    _assert_routed(default, eu)

    # Each run carries its tenant's region for the run queue; acme (default) has none.
    tags = {
        run.tags["tenant"]: run.tags.get("region")
        for run in instance.get_runs()
        if run.job_name == "moderation_backfill"
    }
    assert tags == {"acme": None, "euco": "eu", "apco": "ap"}

    verify = run_cli(["verify", "--json"], env, timeout=300)
    assert verify.returncode == 0, verify.stderr[-2000:]
    verified = {t["tenant"]: t for t in last_json(verify.stdout)["tenants"]}
    assert (verified["acme"]["done"], verified["acme"]["missing"]) == (POSTS, 0)
    assert (verified["euco"]["done"], verified["euco"]["missing"]) == (POSTS, 0)
    assert (verified["apco"]["done"], verified["apco"]["missing"]) == (0, POSTS)
    assert (
        run_cli(
            ["verify", "--require-complete", "--tenant", "acme", "--tenant", "euco"],
            env,
            timeout=300,
        ).returncode
        == 0
    )

    # The keys were read from the run process's environment, never stored in Dagster.
    for path in [*home.rglob("*"), tmp_path / "store.db"]:
        if path.is_file():
            data = path.read_bytes()
            assert EU_KEY.encode() not in data and DEFAULT_KEY.encode() not in data, path

    # With the AP endpoint configured (the EU simulator stands in), apco completes there.
    env["BACKFILL_MODEL_BASE_URL__AP"] = eu.base_url
    env["BACKFILL_MODEL_API_KEY__AP"] = EU_KEY
    again = run_cli(["run", "--tenant", "apco", "--json"], env, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert set(eu.meter.snapshot().billed_by_correlation_id) == _keys("euco") | _keys("apco")
    assert set(default.meter.snapshot().calls_by_correlation_id) == _keys("acme")


@pytest.fixture
def endpoints_seen(tmp_path: Path) -> Iterator[tuple[Engine, set[str]]]:
    """A store, and every endpoint id seen in its shared-limit table while the test runs."""
    engine = engine_for(f"sqlite:///{tmp_path / 'store.db'}")
    seen: set[str] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.02):
            with engine.connect() as conn:
                rows = conn.execute(sa.text("SELECT endpoint FROM limiter_members")).all()
            seen.update(str(r[0]) for r in rows)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    yield engine, seen
    stop.set()
    thread.join(timeout=5)


def test_each_region_paces_with_its_own_limiter_and_shared_limit_membership(
    tmp_path: Path,
    start_sim: StartSim,
    endpoints_seen: tuple[Engine, set[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    default = start_sim(api_key=DEFAULT_KEY, latency_median_ms=40)
    eu = start_sim(api_key=EU_KEY, latency_median_ms=40)
    engine, seen = endpoints_seen
    import_records(engine, tmp_path, _records())
    monkeypatch.setenv("BACKFILL_MODEL_API_KEY__EU", EU_KEY)
    monkeypatch.setenv("BACKFILL_MODEL_API_KEY", DEFAULT_KEY)
    model = OpenAIModelResource(
        ModelSettings(model=MODEL, model_base_url=default.base_url),
        HttpSettings(rpm=6000),
        region_base_urls={"eu": eu.base_url},
        api_key_set=True,
    )
    options = RunOptions(run=RunSettings(concurrency=4), retry=FAST_RETRY, lanes=model.lanes())
    with pytest.raises(RegionUnavailable) as info:
        run_partitions(
            engine,
            refs_for(TENANTS),
            model.build_adapter,
            VERSIONS,
            Rubric(),
            f"test-{uuid.uuid4().hex[:8]}",
            options,
        )
    assert info.value.regions == {"ap": [f"{s}|apco" for s in SLICE_KEYS]}
    calls = {t: 0 for t in TENANTS}
    for rep in info.value.reports:
        calls[rep.ref.tenant_id] += rep.stats.calls
        if rep.ref.tenant_id != "apco":
            assert rep.stats.outcomes.get("accepted", 0) == rep.pending
    assert calls == {"acme": POSTS, "euco": POSTS, "apco": 0}
    _assert_routed(default, eu)
    # Two accounts, two members of the shared limit (endpoint ids name the URL, never a key).
    assert {e.split("#")[0].rstrip("/") for e in seen} == {default.base_url, eu.base_url}
    assert not any(EU_KEY in e or DEFAULT_KEY in e for e in seen)
