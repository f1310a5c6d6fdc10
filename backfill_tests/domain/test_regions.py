"""Region names, their environment variables, run tags and lane planning (pure)."""

from __future__ import annotations

import pytest

from backfill_assets.config.settings import Settings, SettingsError, region_base_urls
from backfill_assets.config.variables import ModelSettings
from backfill_assets.defs.model_resources import (
    FakeModelResource,
    ModelResource,
    OpenAIModelResource,
    model_resource,
)
from backfill_assets.dispatch.pipeline import PartitionRef
from backfill_assets.dispatch.routing import Lanes, route_partitions
from backfill_assets.domain.work.records import Post, Rejection, parse_line
from backfill_assets.domain.work.regions import (
    InvalidRegion,
    api_key_var,
    base_url_var,
    env_suffix,
    region_of_suffix,
    run_tags,
    unavailable_message,
    validate_region,
)
from backfill_assets.providers.batch_client import BatchEndpoint
from backfill_assets.providers.models.fake import FakeModel
from backfill_assets.runner.pooling import PartitionPlan, Plan, pool, pool_by_region

EU_KEY = "sk-eu-only-4b1f0c9e7d2a"


def _model(env: dict[str, str]) -> ModelResource:
    return model_resource(Settings.from_env(env))


@pytest.mark.parametrize("good", ["eu", "us-east", "ap-southeast-2", "a1", "x" * 20, "eu--2"])
def test_well_formed_regions_pass(good: str) -> None:
    assert validate_region(good) == good


@pytest.mark.parametrize(
    "bad", ["", "e", "EU", "Eu", "1eu", "-eu", "eu_west", "eu west", "x" * 21, "eu\n", "é-u"]
)
def test_malformed_regions_are_refused(bad: str) -> None:
    with pytest.raises(InvalidRegion, match=r"does not match \^\[a-z\]"):
        validate_region(bad)


@pytest.mark.parametrize("bad", [None, 3, ["eu"], {"r": "eu"}])
def test_a_region_must_be_a_string(bad: object) -> None:
    with pytest.raises(InvalidRegion, match="must be a string"):
        validate_region(bad)


def test_variable_names_upper_case_the_region_and_map_dashes() -> None:
    assert env_suffix("eu") == "EU"
    assert env_suffix("us-east") == "US_EAST"
    assert base_url_var("us-east") == "BACKFILL_MODEL_BASE_URL__US_EAST"
    assert api_key_var("eu") == "BACKFILL_MODEL_API_KEY__EU"
    assert region_of_suffix("US_EAST") == "us-east"
    for bad in ("eu", "Eu", "US-EAST", "1EU", "E", ""):
        with pytest.raises(InvalidRegion):
            region_of_suffix(bad)


def test_region_endpoints_come_from_suffixed_variables() -> None:
    env = {
        "BACKFILL_MODEL_BASE_URL": "http://default/v1",
        "BACKFILL_MODEL_BASE_URL__EU": " http://eu.example/v1 ",
        "BACKFILL_MODEL_BASE_URL__US_EAST": "http://us-east.example/v1",
        "BACKFILL_MODEL_BASE_URL__AP": "  ",  # empty: not configured, never a fallback
        "BACKFILL_MODEL_API_KEY__EU": EU_KEY,
        "BACKFILL_MODEL_API_KEY__LATAM": "sk-orphan",  # a key without a URL routes nothing
    }
    assert region_base_urls(env) == {
        "eu": "http://eu.example/v1",
        "us-east": "http://us-east.example/v1",
    }
    assert region_base_urls({}) == {}


@pytest.mark.parametrize(
    "name",
    [
        "BACKFILL_MODEL_BASE_URL__eu",
        "BACKFILL_MODEL_BASE_URL__EU-WEST",
        "BACKFILL_MODEL_BASE_URL__",
    ],
)
def test_a_malformed_region_variable_is_a_settings_error(name: str) -> None:
    with pytest.raises(SettingsError, match=name):
        region_base_urls({name: "http://x/v1"})


def test_region_keys_stay_out_of_the_resource_config(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "BACKFILL_MODEL_BACKEND": "openai",
        "BACKFILL_MODEL_BASE_URL": "http://default.example/v1",
        "BACKFILL_MODEL_BASE_URL__EU": "http://eu.example/v1",
        "BACKFILL_MODEL_API_KEY__EU": EU_KEY,
    }
    model = _model(env)
    assert isinstance(model, OpenAIModelResource)
    assert model.region_base_urls == {"eu": "http://eu.example/v1"}
    assert EU_KEY not in repr(model) and EU_KEY not in str(vars(model))
    # The key is read by its fixed name from the run process's environment, when lanes are
    # built at run time; without it the EU endpoint gets no key (never the default one).
    monkeypatch.delenv("BACKFILL_MODEL_API_KEY__EU", raising=False)
    assert model.lanes().batch["eu"].api_key == ""
    monkeypatch.setenv("BACKFILL_MODEL_API_KEY__EU", EU_KEY)
    lanes = model.lanes()
    assert lanes.batch["eu"].api_key == EU_KEY
    assert lanes.batch["eu"].base_url == "http://eu.example/v1"
    assert EU_KEY not in repr(lanes.batch["eu"])
    assert set(lanes.adapters) == {"eu"} and not lanes.any_region


def test_region_config_edited_by_hand_must_name_regions() -> None:
    with pytest.raises(ValueError, match="region 'EU' does not match"):
        OpenAIModelResource(ModelSettings(), region_base_urls={"EU": "http://eu/v1"})


def test_the_fake_serves_every_region_in_process() -> None:
    assert FakeModelResource(ModelSettings()).lanes().lane("ap") == (True, None)
    assert _model({}).lanes().any_region


def test_run_tags_name_the_region_of_the_run() -> None:
    assert run_tags([]) == {}
    assert run_tags([None, None]) == {}
    assert run_tags(["eu"]) == {"region": "eu"}
    assert run_tags(["eu", "eu"]) == {"region": "eu"}
    assert run_tags(["us-east", "eu"]) == {"region": "eu+us-east"}
    assert run_tags(["eu", None]) == {"region": "default+eu"}


def _refs(*tenants: str) -> list[PartitionRef]:
    return [PartitionRef(f"s{i:02d}|{t}", t, i) for t in tenants for i in (0, 1)]


def test_lanes_route_by_region_and_never_fall_back() -> None:
    lanes = Lanes(
        adapters={"eu": FakeModel},
        batch={"eu": BatchEndpoint("http://eu/v1", "m")},
    )
    regions = {"acme": None, "euco": "eu", "apco": "ap"}
    plan = route_partitions(_refs("acme", "euco", "apco", "ghost"), regions, lanes)
    assert {lane: [r.key for r in refs] for lane, refs in plan.lanes.items()} == {
        None: ["s00|acme", "s01|acme", "s00|ghost", "s01|ghost"],
        "eu": ["s00|euco", "s01|euco"],
    }
    assert plan.unroutable == {"ap": ["s00|apco", "s01|apco"]}
    assert plan.region_of == {"acme": None, "ghost": None, "euco": "eu"}
    # Batch mode routes on Batch API endpoints: a region with a sync lane only fails closed.
    sync_only = Lanes(adapters={"eu": FakeModel})
    assert route_partitions(_refs("euco"), regions, sync_only, batch=True).unroutable == {
        "eu": ["s00|euco", "s01|euco"]
    }


def test_the_unavailable_message_names_region_variable_and_tenants() -> None:
    keys = [f"s{i:02d}|apco" for i in range(16)]
    msg = unavailable_message({"ap": keys, "us-east": ["s03|usco"]})
    assert "no endpoint for region 'ap'" in msg and "BACKFILL_MODEL_BASE_URL__AP" in msg
    assert "tenant(s) apco" in msg and "and 10 more" in msg
    assert "region 'us-east'" in msg and "BACKFILL_MODEL_BASE_URL__US_EAST" in msg


def test_an_import_line_may_carry_a_well_formed_region() -> None:
    line = b'{"tenant_id": "acme", "post_id": "p1", "text": "hi", "region": "eu"}'
    post = parse_line(line, 7)
    assert isinstance(post, Post) and (post.region, post.line) == ("eu", 7)
    no_region = parse_line(b'{"tenant_id": "acme", "post_id": "p1", "text": "hi"}', 1)
    null = parse_line(b'{"tenant_id": "acme", "post_id": "p1", "text": "hi", "region": null}', 1)
    assert isinstance(no_region, Post) and no_region.region is None
    assert isinstance(null, Post) and null.region is None
    for raw in (b'"EU"', b'"e"', b"5", b'""', b'"eu west"'):
        bad = parse_line(
            b'{"tenant_id": "acme", "post_id": "p1", "text": "secret words", "region": '
            + raw
            + b"}",
            9,
        )
        assert isinstance(bad, Rejection) and bad.line == 9 and bad.tenant_given == "acme"
        assert "region" in bad.reason and "secret words" not in bad.reason


def _plan(tenants: list[str]) -> Plan:
    parts = [
        PartitionPlan(PartitionRef(f"s00|{t}", t, 0, 0), 1, 1, t != "idle", "") for t in tenants
    ]
    return Plan(parts, pool(parts, [p.ref.key for p in parts]))


def test_pooled_runs_never_mix_regions() -> None:
    tenants = ["a", "b", "eu1", "eu2", "idle", "c", "ap1"]
    order = [f"s00|{t}" for t in tenants]
    plan = _plan(tenants)
    assert [b.tenants for b in plan.boxes] == [tuple(tenants)]  # one box, five regions' worth
    region_of = {"eu1": "eu", "eu2": "eu", "ap1": "ap"}
    split = pool_by_region(plan, order, region_of)
    assert [b.tenants for b in split.boxes] == [("a", "b"), ("eu1", "eu2"), ("c",), ("ap1",)]
    assert split.partitions == plan.partitions
    # The idle tenant rode along in the one box; between two regions it is left out.
    assert plan.skipped == [] and [p.ref.tenant_id for p in split.skipped] == ["idle"]
    # Each box is one region, so its run carries one region tag (none for the default lane).
    tags = [run_tags(region_of.get(t) for t in b.tenants) for b in split.boxes]
    assert tags == [{}, {"region": "eu"}, {}, {"region": "ap"}]
