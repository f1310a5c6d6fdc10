"""The webserver decides nothing about where data or money goes: a real ``dagster-webserver``,
launches through its GraphQL API, a provider on one port and a decoy on another.

One webserver for the module (start-up is seconds): runs launch straight from it (the default
run coordinator, no daemon) in run workers that load the definitions from their own
environment. The store is PostgreSQL with a password in its URL, so the run snapshot and the
resource queries can be searched for it.
Marker ``pg``: under CI=true an unreachable PostgreSQL fails these tests instead of skipping.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from backfill_assets.cli import build_parser
from backfill_assets.config.settings import Settings
from backfill_assets.defs.resources import resources
from backfill_assets.ledger.engines import engine_for
from backfill_assets.providersim import SimConfig, Simulator
from backfill_tests.cli_runs import ROOT, clean_env
from backfill_tests.conftest import dispose_engine, pg_database, write_jsonl
from backfill_tests.security.config_fields import job_config_leaves, nested, resource_fields
from backfill_tests.security.scan import store_leaks, text_leaks, tree_leaks
from backfill_tests.sessions import kill_sessions, start_session

pytestmark = [pytest.mark.pg, pytest.mark.xdist_group("servers")]

WEBSERVER = Path(sys.executable).parent / "dagster-webserver"
API_KEY = "sk-proj-websrv-Q2hhbmdlTWUtc2VjcmV0LWtleQ"
PASSWORD = "pw-Zm9yLXRoZS1zdG9yZS1vbmx5"
MARKER = "mrk-7d1e-only-in-posts"
# A variable of the run worker's environment that nothing but a leak would ever show.
PROBE_VAR = "BACKFILL_LEAK_PROBE"
PROBE = "probe-e3b0c442-only-in-the-worker-env"
PARTITION = "s00|acme"
LOCATION = {"repositoryLocationName": "backfill_assets", "repositoryName": "__repository__"}
# Runs start from the webserver itself: no daemon, no queue.
INSTANCE_YAML = """\
telemetry:
  enabled: false
instance_class:
  module: backfill_assets.accelerators.sqlite_instance
  class: EmbeddedInstance
run_coordinator:
  module: dagster._core.run_coordinator
  class: DefaultRunCoordinator
"""
_LAUNCH = """
  {alias}: launchRun(executionParams: {params}) {{
    __typename
    ... on LaunchRunSuccess {{ run {{ runId }} }}
    ... on RunConfigValidationInvalid {{ errors {{ message }} }}
    ... on PythonError {{ message }}
  }}"""
_RUN = """query($id: ID!) { runOrError(runId: $id) { ... on Run { status
  eventConnection { events { __typename ... on MessageEvent { message }
  ... on ExecutionStepFailureEvent { error { message } } } } } } }"""


@dataclass
class Server:
    """The webserver, its environment and what it is wired to."""

    base_url: str
    env: dict[str, str]
    home: Path
    store_url: str
    provider: Simulator
    decoy: Simulator
    log: Path
    imports: Path
    outside: Path
    run_id: str = ""

    def gql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        resp = httpx.post(
            f"{self.base_url}/graphql", json={"query": query, "variables": variables}, timeout=60
        )
        assert resp.status_code == 200, resp.text[:3000]
        doc: dict[str, Any] = resp.json()
        assert not doc.get("errors"), doc["errors"]
        data: dict[str, Any] = doc["data"]
        return data

    def launch(self, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One ``launchRun`` per item (aliased, one request): the answers in order."""
        body = "".join(
            _LAUNCH.format(alias=f"l{i}", params=_graphql_literal(p)) for i, p in enumerate(runs)
        )
        data = self.gql("mutation {" + body + "\n}")
        return [data[f"l{i}"] for i in range(len(runs))]

    def wait(self, run_id: str, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run: dict[str, Any] = self.gql(_RUN, {"id": run_id})["runOrError"]
            if run.get("status") in ("SUCCESS", "FAILURE", "CANCELED"):
                return run
            time.sleep(0.5)
        raise AssertionError(f"run {run_id} did not finish:\n{self.log.read_text()[-3000:]}")

    def run_count(self) -> int:
        data = self.gql("{ runsOrError { ... on Runs { count } } }")
        count: int = data["runsOrError"]["count"]
        return count


def _graphql_literal(value: Any) -> str:
    """A GraphQL input literal (object keys unquoted; strings JSON-quoted)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_graphql_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_graphql_literal(v) for v in value) + "]"
    return json.dumps(value)


def labels_run(run_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Execution params of moderation_backfill over one partition."""
    tenant, slice_key = PARTITION.split("|")[1], PARTITION.split("|")[0]
    params: dict[str, Any] = {
        "selector": {**LOCATION, "jobName": "moderation_backfill"},
        "executionMetadata": {
            "tags": [
                {"key": "dagster/partition", "value": PARTITION},
                {"key": "dagster/partition/tenant", "value": tenant},
                {"key": "dagster/partition/slice", "value": slice_key},
            ]
        },
    }
    if run_config is not None:
        # runConfigData is a scalar of type RunConfigData: a JSON string is accepted.
        params["runConfigData"] = json.dumps(run_config)
    return params


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_ready(server: Server, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    query = '{ assetNodeOrError(assetKey: {path: ["moderation_labels"]}) { __typename } }'
    while time.monotonic() < deadline:
        assert proc.poll() is None, server.log.read_text()[-3000:]
        try:
            if server.gql(query)["assetNodeOrError"]["__typename"] == "AssetNode":
                return
        except (httpx.HTTPError, AssertionError):
            pass
        time.sleep(0.25)
    raise AssertionError(f"webserver not ready in {timeout}s:\n{server.log.read_text()[-3000:]}")


def _import(env: dict[str, str], path: Path) -> None:
    """The CLI's import (in-process): posts into the store, tenants into the instance."""
    args = build_parser().parse_args(["import", str(path), "--json"])
    assert args.func(args, Settings.from_env(env)) == 0


def posts(tenant: str, n: int, what: str) -> list[dict[str, str]]:
    """``n`` posts of a tenant whose every text carries ``what``."""
    return [
        {"tenant_id": tenant, "post_id": f"{what[:3]}{i}", "text": f"{what} line {i}\nok {i}"}
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def server(pg_available: bool, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if not pg_available:
        pytest.skip("PostgreSQL not available (set BACKFILL_TEST_PG_URL)")
    tmp = tmp_path_factory.mktemp("webserver")
    with pg_database("bf_sec") as bare:
        yield from _serve(tmp, bare)


def _serve(tmp: Path, bare: str) -> Iterator[Server]:
    store_url = sa.engine.make_url(bare).set(password=PASSWORD).render_as_string(False)
    home, imports = tmp / "home", tmp / "imports"
    home.mkdir()
    imports.mkdir()
    (home / "dagster.yaml").write_text(INSTANCE_YAML)
    write_jsonl(imports / "acme.jsonl", posts("acme", 6, MARKER))
    outside = write_jsonl(tmp / "outside.jsonl", posts("acme", 3, "planted"))
    provider = Simulator(SimConfig(api_key=API_KEY)).start()
    decoy = Simulator(SimConfig()).start()
    port = _free_port()
    env = clean_env()
    env.update(
        DAGSTER_HOME=str(home),
        BACKFILL_DATABASE_URL=store_url,
        BACKFILL_IMPORT_DIR=str(imports),
        BACKFILL_MODEL_BACKEND="openai",
        BACKFILL_MODEL_BASE_URL=provider.base_url,
        BACKFILL_MODEL_API_KEY=API_KEY,
        BACKFILL_MAX_ATTEMPTS="2",
        **{PROBE_VAR: PROBE},
    )
    log = tmp / "webserver.log"
    srv = Server(
        f"http://127.0.0.1:{port}", env, home, store_url, provider, decoy, log, imports, outside
    )
    procs: list[subprocess.Popen[bytes]] = []
    try:
        _import(env, imports / "acme.jsonl")
        argv = [str(WEBSERVER), "-w", str(ROOT / "workspace.yaml"), "-h", "127.0.0.1"]
        procs.append(start_session([*argv, "-p", str(port)], env, home, log))
        _wait_ready(srv, procs[0], timeout=120)
        # The one run with the deployment's own configuration, which the tests compare with.
        (ok,) = srv.launch([labels_run()])
        assert ok["__typename"] == "LaunchRunSuccess", ok
        srv.run_id = ok["run"]["runId"]
        run = srv.wait(srv.run_id)
        assert run["status"] == "SUCCESS", (run, log.read_text()[-3000:])
        yield srv
    finally:
        kill_sessions(procs)
        provider.stop()
        decoy.stop()
        dispose_engine(store_url)


def _overrides(server: Server) -> list[tuple[str, str, Any]]:
    """(resource, field, value) for every field every resource class has, values a launch
    would have passed before: the model's URLs pointed at the decoy, keys read from variables
    of the server's environment."""
    found: list[tuple[str, str, Any]] = []
    for name, resource in resources(Settings.from_env(server.env)).items():
        for field, value in resource_fields(resource).items():
            found.append((name, field, value if value is not None else ""))
    decoy = server.decoy.base_url
    found += [
        ("model", "base_url", decoy),
        ("model", "model_base_url", decoy),
        ("model", "api_key", {"env": "BACKFILL_MODEL_API_KEY"}),
        ("model", "api_key", {"env": "HOME"}),
        ("model", "region_base_urls", {"eu": decoy}),
        ("io_manager", "base_dir", str(server.home.parent / "elsewhere")),
    ]
    return found


def test_every_resource_override_is_refused_at_launch_naming_the_field(server: Server) -> None:
    overrides = _overrides(server)
    assert {"store", "model", "settings", "checks"} <= {r for r, _f, _v in overrides}
    before = server.run_count()
    answers = server.launch(
        [labels_run({"resources": {r: {"config": {f: v}}}}) for r, f, v in overrides]
    )
    for (resource, field, _value), answer in zip(overrides, answers, strict=True):
        assert answer["__typename"] == "RunConfigValidationInvalid", (resource, field, answer)
        messages = " ".join(e["message"] for e in answer["errors"])
        assert f'"{field}"' in messages and f"resources:{resource}:config" in messages, messages
    # Refused before a run existed: nothing was created, nothing reached the other port.
    assert server.run_count() == before
    assert server.decoy.meter.snapshot().requests_total == 0


def test_a_backfill_carrying_resource_config_starts_no_run(server: Server) -> None:
    before = server.run_count()
    params = {
        "selector": {
            "partitionSetName": "moderation_backfill_partition_set",
            "repositorySelector": LOCATION,
        },
        "partitionNames": [PARTITION],
        "forceSynchronousSubmission": True,
        "runConfigData": json.dumps(
            {"resources": {"model": {"config": {"base_url": server.decoy.base_url}}}}
        ),
    }
    query = """mutation($p: LaunchBackfillParams!) {
      launchPartitionBackfill(backfillParams: $p) { __typename ... on PythonError { message }
      ... on LaunchBackfillSuccess { launchedRunIds } } }"""
    answer = httpx.post(
        f"{server.base_url}/graphql", json={"query": query, "variables": {"p": params}}, timeout=60
    ).json()
    # Dagster accepts a backfill's run config unchecked, then validates it as it creates the
    # runs: refused there, naming the field, so no run exists.
    result = answer["data"]["launchPartitionBackfill"]
    assert result["__typename"] == "PythonError", answer
    assert 'unexpected config entry "base_url"' in result["message"], result
    assert server.run_count() == before
    assert server.decoy.meter.snapshot().requests_total == 0


def test_the_run_used_the_deployment_provider_and_key(server: Server) -> None:
    meter = server.provider.meter.snapshot()
    assert len(meter.billed) == 6 and meter.refusals_by_status == {}
    assert server.decoy.meter.snapshot().requests_total == 0


def test_posts_path_outside_the_import_directory_fails_and_plants_nothing(server: Server) -> None:
    engine = engine_for(server.store_url)

    def acme_posts() -> int:
        with engine.connect() as conn:
            return int(
                conn.execute(sa.text("SELECT count(*) FROM posts WHERE tenant_id='acme'")).scalar()
                or 0
            )

    before = acme_posts()
    params = {
        "selector": {**LOCATION, "jobName": "__ASSET_JOB", "assetSelection": [{"path": ["posts"]}]},
        "runConfigData": json.dumps({"ops": {"posts": {"config": {"path": str(server.outside)}}}}),
    }
    (answer,) = server.launch([params])
    assert answer["__typename"] == "LaunchRunSuccess", answer
    run = server.wait(answer["run"]["runId"])
    assert run["status"] == "FAILURE"
    messages = json.dumps(run["eventConnection"]["events"])
    assert "outside the import directory" in messages and "BACKFILL_IMPORT_DIR" in messages
    assert acme_posts() == before


RESOURCE_QUERY = """
{ allTopLevelResourceDetailsOrError(repositorySelector: {repositoryLocationName:
    "backfill_assets", repositoryName: "__repository__"}) {
    ... on ResourceDetailsList { results { name description resourceType
      configFields { name defaultValueAsJson description }
      configuredValues { key value type } } } } }
"""


def test_no_secret_or_post_in_dagster_storage_or_graphql(server: Server) -> None:
    needles = [API_KEY, PASSWORD, MARKER]
    answers = [server.gql(RESOURCE_QUERY)]
    for name in ("store", "model", "settings", "checks", "io_manager"):
        answers.append(
            server.gql(
                "query($n: String!) { topLevelResourceDetailsOrError(resourceSelector: "
                '{repositoryLocationName: "backfill_assets", repositoryName: "__repository__", '
                "resourceName: $n}) { ... on ResourceDetails { configuredValues { key value } "
                "configFields { name defaultValueAsJson } } } }",
                {"n": name},
            )
        )
    answers.append(
        server.gql(
            "query($id: ID!) { runOrError(runId: $id) { ... on Run { runConfigYaml tags "
            "{ key value } } } }",
            {"id": server.run_id},
        )
    )
    answers.append(server.gql("{ instance { info } }"))
    served = json.dumps(answers)
    resources = answers[0]["allTopLevelResourceDetailsOrError"]["results"]
    assert {r["name"] for r in resources} >= {"store", "model", "settings", "checks"}
    assert all(not r["configFields"] and not r["configuredValues"] for r in resources)
    assert text_leaks("graphql", served, needles) == []
    assert tree_leaks(server.home, needles) == []
    assert text_leaks("webserver log", server.log.read_text(errors="replace"), needles) == []
    assert store_leaks(engine_for(server.store_url), needles) == []


def test_no_launch_config_field_reads_the_worker_environment(server: Server) -> None:
    """Every leaf field of every job's run config, enumerated from the definitions, tried with
    ``{"env": NAME}`` for a probe variable, the model key's and the store URL's: each launch
    is refused naming the field, and no value reaches storage, logs or GraphQL."""
    leaves = job_config_leaves(Settings.from_env(server.env))
    assert {j.name for j, _p, _k in leaves} >= {"moderation_backfill", "import_posts"}
    assert any(p == ("ops", "posts", "config", "path") for _j, p, _k in leaves)
    launches: list[tuple[str, tuple[str, ...], dict[str, Any]]] = []
    for job, path, _kind in leaves:
        for var in (PROBE_VAR, "BACKFILL_MODEL_API_KEY", "BACKFILL_DATABASE_URL"):
            params = {
                "selector": {**LOCATION, "jobName": job.name},
                "runConfigData": json.dumps(nested(path, {"env": var})),
            }
            launches.append((job.name, path, params))
    before = server.run_count()
    answers = server.launch([params for _j, _p, params in launches])
    for (job_name, path, _params), answer in zip(launches, answers, strict=True):
        assert answer["__typename"] == "RunConfigValidationInvalid", (job_name, path, answer)
        messages = " ".join(e["message"] for e in answer["errors"])
        assert path[-1] in messages, (job_name, path, messages)
    assert server.run_count() == before
    runs = server.gql("{ runsOrError { ... on Runs { results { runId runConfigYaml } } } }")
    served = json.dumps([answers, runs])
    needles = [PROBE, API_KEY, PASSWORD]
    assert text_leaks("graphql", served, needles) == []
    assert tree_leaks(server.home, needles) == []  # the instance's storage and compute logs
    assert text_leaks("webserver log", server.log.read_text(errors="replace"), needles) == []
    assert store_leaks(engine_for(server.store_url), needles) == []
