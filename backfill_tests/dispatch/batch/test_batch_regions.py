"""Batch mode routes by region too: an EU tenant's batch files go only to the EU Batch API,
and a tenant whose region has no endpoint uploads nothing anywhere."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from backfill_assets.dispatch.pipeline import RegionUnavailable
from backfill_assets.dispatch.routing import Lanes
from backfill_assets.domain.work.keys import SLICE_KEYS
from backfill_assets.providers.batch_client import BatchEndpoint
from backfill_tests.conftest import import_records
from backfill_tests.dispatch.batch.conftest import (
    MODEL,
    StartSim,
    batch_options,
    key_of,
    records,
    rows,
    run_batch,
)

EU_KEY = "sk-batch-eu-0a9b8c7d6e5f4a3b"


def test_batch_mode_sends_each_tenant_to_its_region_only(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    default, eu = start_sim(), start_sim(api_key=EU_KEY)
    recs = records(["acme", "euco", "apco"], 6)
    regions = {"euco": "eu", "apco": "ap"}
    for r in recs:
        if r["tenant_id"] in regions:
            r["region"] = regions[r["tenant_id"]]
    import_records(engine, tmp_path, recs)
    eu_endpoint = BatchEndpoint(eu.base_url, MODEL, api_key=EU_KEY)
    options = dataclasses.replace(batch_options(default), lanes=Lanes(batch={"eu": eu_endpoint}))
    with pytest.raises(RegionUnavailable) as info:
        run_batch(engine, ["acme", "euco", "apco"], options)
    assert info.value.regions == {"ap": [f"{s}|apco" for s in SLICE_KEYS]}
    assert "no endpoint for region 'ap'" in str(info.value)

    keys = {t: {key_of(r) for r in recs if r["tenant_id"] == t} for t in ("acme", "euco")}
    d, e = default.meter.snapshot(), eu.meter.snapshot()
    assert set(d.billed_by_correlation_id) == keys["acme"]
    assert set(e.billed_by_correlation_id) == keys["euco"]
    assert d.refusals_by_status == {} and e.refusals_by_status == {}  # each got its own key
    assert d.files_uploaded >= 1 and e.files_uploaded >= 1
    tenants = {r.tenant_id for r in rows(engine, "SELECT DISTINCT tenant_id FROM ledger_events")}
    assert tenants == {"acme", "euco"}  # not even an attempt was written for apco
