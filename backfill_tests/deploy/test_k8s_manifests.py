"""The Kubernetes files docs/operations.md describes (deploy/k8s/) are what they say, no cluster
needed.

- Every manifest validates against the Kubernetes schemas bundled by the pinned
  ``kubernetes-validate``, strictly (an unknown or misspelt field is an error), and a broken one
  is refused.
- The ConfigMap holds documented settings and no secret, the example Secret holds only secrets,
  as placeholders, and together they are settings the code location accepts.
- The Helm values (not a Kubernetes object) name what is shipped: the ConfigMap and Secrets,
  the run launcher ``K8sRunLauncher``, the tolerations, run retries, the module of
  ``workspace.yaml``.
- The run worker's Job: the instance sections the chart writes from the values (mirrored here
  from the chart's templates: no helm binary, no network) configure a real ``K8sRunLauncher`` of
  dagster-k8s, which launches a run against a stub Kubernetes API; the Job it sends is
  validated like the manifests and carries the image, settings, tolerations and grace period.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from itertools import pairwise
from pathlib import Path
from typing import Any

import kubernetes
import kubernetes_validate
import pytest
import yaml
from dagster._core.code_pointer import ModuleCodePointer
from dagster._core.launcher import LaunchRunContext
from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
from dagster._core.storage.dagster_run import DagsterRun
from dagster._core.test_utils import instance_for_test
from dagster_postgres.utils import get_conn_string

from backfill_assets.config.settings import Settings
from backfill_assets.ledger.dead_peer import DeadPeer
from backfill_assets.wiring import BACKFILL_JOB
from backfill_tests.cli_runs import ROOT

K8S = ROOT / "deploy" / "k8s"
VALUES = K8S / "values.yaml"
# The oldest and newest Kubernetes minor releases the validator's schemas are checked against.
KUBERNETES_VERSIONS = ("1.30", "1.37")
# The chart's release name and namespace of docs/operations.md's helm command.
RELEASE = "dagster"
# Settings that hold a password or a key: the Secret's, never the ConfigMap's.
SECRET_VARIABLES = {
    "BACKFILL_DATABASE_URL",
    "BACKFILL_MODEL_API_KEY",
    "BACKFILL_SINK_URL",
    "BACKFILL_SOURCE_URL",
}
REGIONAL_KEY = "BACKFILL_MODEL_API_KEY__"
PLACEHOLDER = "CHANGE-ME"
UNREACHABLE = "node.kubernetes.io/unreachable"
NOT_READY = "node.kubernetes.io/not-ready"


def manifests() -> list[tuple[str, dict[str, Any]]]:
    """Every Kubernetes object shipped in deploy/k8s/, with the file it is in."""
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        if path == VALUES:
            continue
        for doc in yaml.safe_load_all(path.read_text("utf-8")):
            if doc:
                found.append((path.name, doc))
    return found


def shipped(kind: str) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for _, m in manifests() if m["kind"] == kind}


def validate(obj: Mapping[str, Any]) -> None:
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(dict(obj), version, strict=True)


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(VALUES.read_text("utf-8"))
    return loaded


def _names(sources: list[dict[str, str]]) -> list[str]:
    return [s["name"] for s in sources]


def _workspace_module() -> str:
    workspace = yaml.safe_load((ROOT / "workspace.yaml").read_text("utf-8"))
    module: str = workspace["load_from"][0]["python_module"]["module_name"]
    return module


def _tolerations_problems(pod_spec: Mapping[str, Any]) -> Iterator[str]:
    tolerations = {t.get("key"): t for t in pod_spec.get("tolerations") or []}
    for key in (UNREACHABLE, NOT_READY):
        toleration = tolerations.get(key)
        if toleration is None:
            yield f"run pods do not tolerate {key} for a bounded time"
        elif toleration.get("effect") != "NoExecute" or toleration.get("tolerationSeconds") != 30:
            yield f"{key}: NoExecute for 30 s expected, got {toleration}"
    if pod_spec.get("terminationGracePeriodSeconds") != 30:
        yield "run pods' terminationGracePeriodSeconds is not 30"


def values_problems(vals: Mapping[str, Any]) -> list[str]:
    """What the Helm values get wrong against the shipped manifests and the docs."""
    problems: list[str] = []
    config_maps, secrets = shipped("ConfigMap"), shipped("Secret")

    def refs(where: str, block: Mapping[str, Any]) -> None:
        maps, keys = _names(block.get("envConfigMaps", [])), _names(block.get("envSecrets", []))
        if "backfill-settings" not in maps or "backfill-secrets" not in keys:
            problems.append(f"{where}: backfill-settings and backfill-secrets not both named")
        problems.extend(f"{where}: no ConfigMap {n} shipped" for n in maps if n not in config_maps)
        problems.extend(f"{where}: no Secret {n} shipped" for n in keys if n not in secrets)

    launcher = vals["runLauncher"]
    if launcher["type"] != "K8sRunLauncher":
        problems.append(f"run launcher {launcher['type']}, not K8sRunLauncher")
    k8s = launcher["config"]["k8sRunLauncher"]
    refs("runLauncher", k8s)
    if k8s.get("jobNamespace") != RELEASE:
        problems.append(f"run Jobs go to namespace {k8s.get('jobNamespace')}, not {RELEASE}")
    pod_spec = k8s.get("runK8sConfig", {}).get("podSpecConfig", {})
    problems.extend(_tolerations_problems(pod_spec))

    deployments = vals["dagster-user-deployments"]["deployments"]
    if len(deployments) != 1:
        problems.append(f"{len(deployments)} code locations, one expected")
    for deployment in deployments:
        refs(f"code location {deployment['name']}", deployment)
        args = deployment.get("dagsterApiGrpcArgs") or deployment.get("codeServerArgs") or []
        module = next((b for a, b in pairwise(args) if a in ("-m", "--module-name")), None)
        if module != _workspace_module():
            problems.append(f"code location serves {module}, workspace.yaml {_workspace_module()}")

    daemon = vals["dagsterDaemon"]
    retries = daemon["runRetries"]
    if not (retries.get("enabled") and retries.get("maxRetries", 0) >= 1):
        problems.append("run retries are off: a run on a lost node is not launched again")
    if not daemon["runMonitoring"].get("enabled"):
        problems.append("run monitoring is off: a lost run pod is never noticed")
    if vals["postgresql"].get("enabled") or vals.get("generatePostgresqlPasswordSecret", True):
        problems.append("the chart's own PostgreSQL or password Secret is on")
    pg_secret = secrets.get(vals["global"]["postgresqlSecretName"])
    if pg_secret is None or "postgresql-password" not in pg_secret.get("stringData", {}):
        problems.append("no shipped Secret holds the instance's postgresql-password")
    return problems


def chart_instance_sections(vals: Mapping[str, Any], kubeconfig: Path) -> dict[str, Any]:
    """The dagster.yaml sections the chart writes from these values (its templates
    helpers/instance/_run-launcher.tpl, _run-coordinator.tpl and configmap-instance.yaml),
    except that the launcher reads a stub kubeconfig instead of the cluster's."""
    k8s = vals["runLauncher"]["config"]["k8sRunLauncher"]
    run_k8s = k8s.get("runK8sConfig", {})
    launcher: dict[str, Any] = {
        "load_incluster_config": False,  # the chart: k8s["loadInclusterConfig"]
        "kubeconfig_file": str(kubeconfig),
        "job_namespace": k8s.get("jobNamespace") or RELEASE,
        "image_pull_policy": k8s["imagePullPolicy"],
        "service_account_name": vals["global"]["serviceAccountName"],
        "dagster_home": vals["global"]["dagsterHome"],
        "instance_config_map": f"{RELEASE}-instance",
        "postgres_password_secret": vals["global"]["postgresqlSecretName"],
        "env_config_maps": _names(k8s.get("envConfigMaps", [])),
        "env_secrets": _names(k8s.get("envSecrets", [])),
        "resources": k8s.get("resources", {}),
        "run_k8s_config": {
            snake: run_k8s[camel]
            for camel, snake in (
                ("containerConfig", "container_config"),
                ("podSpecConfig", "pod_spec_config"),
                ("podTemplateSpecMetadata", "pod_template_spec_metadata"),
                ("jobSpecConfig", "job_spec_config"),
                ("jobMetadata", "job_metadata"),
            )
            if run_k8s.get(camel)
        },
    }
    daemon = vals["dagsterDaemon"]
    queued = daemon["runCoordinator"]["config"]["queuedRunCoordinator"]
    monitoring, retries = daemon["runMonitoring"], daemon["runRetries"]
    return {
        "run_launcher": {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": launcher},
        "run_coordinator": {
            "module": "dagster.core.run_coordinator",
            "class": "QueuedRunCoordinator",
            "config": {
                "max_concurrent_runs": queued["maxConcurrentRuns"],
                "tag_concurrency_limits": queued["tagConcurrencyLimits"],
                "dequeue_interval_seconds": queued["dequeueIntervalSeconds"],
                "dequeue_use_threads": queued["dequeueUseThreads"],
                "dequeue_num_workers": queued["dequeueNumWorkers"],
            },
        },
        "run_monitoring": {
            "enabled": monitoring["enabled"],
            "start_timeout_seconds": monitoring["startTimeoutSeconds"],
            "max_resume_run_attempts": monitoring["maxResumeRunAttempts"],
            "poll_interval_seconds": monitoring["pollIntervalSeconds"],
            "free_slots_after_run_end_seconds": monitoring["freeSlotsAfterRunEndSeconds"],
        },
        "run_retries": {"enabled": retries["enabled"], "max_retries": retries["maxRetries"]},
    }


def _stub_kubeconfig(path: Path) -> Path:
    # A cluster nobody asks: the launch below goes to a stub API, never over the network.
    cluster = {"name": "none", "cluster": {"server": "https://127.0.0.1:1"}}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "none", "user": {"token": "none"}}],
        "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
        "current-context": "none",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def render_run_job(vals: Mapping[str, Any], tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """The namespace and Job the K8sRunLauncher these values configure creates for a run."""
    sections = chart_instance_sections(vals, _stub_kubeconfig(tmp_path / "kubeconfig"))
    deployment = vals["dagster-user-deployments"]["deployments"][0]
    image = f"{deployment['image']['repository']}:{deployment['image']['tag']}"
    # includeConfigInLaunchedRuns: the chart hands the code location's env sources to its runs
    # as the code server's container context.
    context = {
        "k8s": {
            "env_config_maps": _names(deployment.get("envConfigMaps", [])),
            "env_secrets": _names(deployment.get("envSecrets", [])),
        }
    }
    origin = JobPythonOrigin(
        BACKFILL_JOB,
        RepositoryPythonOrigin(
            executable_path="/usr/local/bin/python",
            code_pointer=ModuleCodePointer(_workspace_module(), "defs", None),
            container_image=image,
            container_context=context,
        ),
    )
    created: list[tuple[Any, str]] = []
    with instance_for_test(overrides=sections) as instance:
        launcher = instance.run_launcher
        client = launcher._api_client  # type: ignore[attr-defined]
        client.create_namespaced_job_with_retries = lambda body, namespace: created.append(
            (body, namespace)
        )
        run = instance.add_run(
            DagsterRun(
                job_name=BACKFILL_JOB,
                run_id="1" * 8 + "-0000-4000-8000-" + "0" * 12,
                job_code_origin=origin,
            )
        )
        launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
    (body, namespace), *more = created
    assert more == []
    job: dict[str, Any] = kubernetes.client.ApiClient().sanitize_for_serialization(body)
    return namespace, job


@pytest.mark.parametrize(
    "name,manifest",
    [pytest.param(n, m, id=f"{m['kind']}/{m['metadata']['name']}") for n, m in manifests()],
)
def test_every_manifest_is_a_valid_kubernetes_object(name: str, manifest: dict[str, Any]) -> None:
    validate(manifest)
    assert manifest["metadata"]["namespace"] == RELEASE, name


def test_the_manifests_are_the_ones_the_docs_name() -> None:
    assert set(shipped("ConfigMap")) == {"backfill-settings"}
    assert set(shipped("Secret")) == {"backfill-secrets", "dagster-postgresql-secret"}


def test_a_broken_manifest_is_refused() -> None:
    config_map = copy.deepcopy(shipped("ConfigMap")["backfill-settings"])
    config_map["data"]["BACKFILL_RPM"] = 3000  # a number where Kubernetes wants a string
    with pytest.raises(kubernetes_validate.ValidationError, match="3000"):
        validate(config_map)
    secret = copy.deepcopy(shipped("Secret")["backfill-secrets"])
    secret["strinData"] = secret.pop("stringData")  # misspelt: strict schemas refuse it
    with pytest.raises(kubernetes_validate.ValidationError, match="strinData"):
        validate(secret)


def test_settings_go_to_the_configmap_and_keys_to_the_secret() -> None:
    config = (ROOT / "docs" / "configuration.md").read_text("utf-8")
    documented = set(re.findall(r"^\| `(BACKFILL_[A-Z0-9_]+)` \|", config, re.MULTILINE))
    settings = shipped("ConfigMap")["backfill-settings"]["data"]
    assert set(settings) <= documented, set(settings) - documented
    is_secret = [k for k in settings if k in SECRET_VARIABLES or k.startswith(REGIONAL_KEY)]
    assert is_secret == [], "a secret in the ConfigMap"
    keys = shipped("Secret")["backfill-secrets"]["stringData"]
    assert "BACKFILL_DATABASE_URL" in keys
    assert all(k in SECRET_VARIABLES or k.startswith(REGIONAL_KEY) for k in keys), keys
    # Placeholders only: every value of every shipped Secret says so.
    for secret in shipped("Secret").values():
        assert all(PLACEHOLDER in v for v in secret["stringData"].values()), secret
    # ... and the code location accepts the two together as its environment.
    parsed = Settings.from_env({**settings, **keys})
    assert parsed.model.model_backend == settings["BACKFILL_MODEL_BACKEND"]
    assert parsed.run.concurrency == int(settings["BACKFILL_CONCURRENCY"])


def test_the_helm_values_name_what_is_shipped() -> None:
    assert values_problems(values()) == []


def test_the_instance_url_gives_a_vanished_pod_up_as_bin_prod_does() -> None:
    # The chart builds the instance's URL with dagster-postgres from postgresql.*: it carries
    # the keepalive parameters and startup options bin/prod adds to DAGSTER_PG_URL, for the
    # ConfigMap's BACKFILL_PG_DEAD_PEER_SECONDS.
    pg = values()["postgresql"]
    seconds = shipped("ConfigMap")["backfill-settings"]["data"]["BACKFILL_PG_DEAD_PEER_SECONDS"]
    peer = DeadPeer(float(seconds))
    assert pg["postgresqlParams"] == {**peer.client_params(), "options": peer.startup_options()}
    url = get_conn_string(
        pg["postgresqlUsername"],
        PLACEHOLDER,
        pg["postgresqlHost"],
        pg["postgresqlDatabase"],
        str(pg["service"]["port"]),
        pg["postgresqlParams"],
        pg["postgresqlScheme"],
    )
    assert url.startswith("postgresql+psycopg2://")
    assert peer.url_with_params(url) == url  # nothing left to add


def test_the_values_check_finds_what_is_wrong() -> None:
    broken = values()
    launcher = broken["runLauncher"]["config"]["k8sRunLauncher"]
    launcher["envSecrets"] = [{"name": "backfill-secret"}]
    pod_spec = launcher["runK8sConfig"]["podSpecConfig"]
    pod_spec["tolerations"] = pod_spec["tolerations"][:1]
    broken["dagsterDaemon"]["runRetries"]["enabled"] = False
    broken["dagster-user-deployments"]["deployments"][0]["dagsterApiGrpcArgs"][1] = "defs"
    problems = values_problems(broken)
    assert "runLauncher: no Secret backfill-secret shipped" in problems
    assert f"run pods do not tolerate {NOT_READY} for a bounded time" in problems
    assert any(p.startswith("run retries are off") for p in problems)
    assert any(p.startswith("code location serves defs") for p in problems)


def test_the_run_worker_job_is_valid_and_carries_the_deployment(tmp_path: Path) -> None:
    vals = values()
    namespace, job = render_run_job(vals, tmp_path)
    validate(job)
    assert namespace == RELEASE
    pod = job["spec"]["template"]["spec"]
    assert list(_tolerations_problems(pod)) == []
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 93600
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/backfill-moderation:1"
    assert container["args"][1:5] == ["-m", "dagster", "api", "execute_run"]
    assert container["resources"]["limits"]["memory"] == "2Gi"
    sources = [next(iter(s.items())) for s in container["envFrom"]]
    assert sources == [
        ("configMapRef", {"name": "backfill-settings"}),
        ("secretRef", {"name": "backfill-secrets"}),
    ]
    env = {e["name"]: e for e in container["env"]}
    assert env["DAGSTER_HOME"]["value"] == vals["global"]["dagsterHome"]
    password = next(e for e in env.values() if "valueFrom" in e)["valueFrom"]["secretKeyRef"]
    assert password == {"name": "dagster-postgresql-secret", "key": "postgresql-password"}
    assert pod["serviceAccountName"] == vals["global"]["serviceAccountName"]


def test_a_broken_run_k8s_config_is_refused(tmp_path: Path) -> None:
    # A misspelt field: dagster-k8s itself refuses to build the Job.
    vals = values()
    pod_spec = vals["runLauncher"]["config"]["k8sRunLauncher"]["runK8sConfig"]["podSpecConfig"]
    toleration = pod_spec["tolerations"][0]
    toleration["tolerationSecond"] = toleration.pop("tolerationSeconds")
    with pytest.raises(Exception, match="Unexpected keys in model class V1Toleration"):
        render_run_job(vals, tmp_path)
    # dagster-k8s builds typed Kubernetes models, coercing values to their types, so what reaches
    # the validator is well typed; the validator still refuses a Job that is not.
    _, job = render_run_job(values(), tmp_path)
    job["spec"]["template"]["spec"]["tolerations"][0]["tolerationSeconds"] = "30 s"
    with pytest.raises(kubernetes_validate.ValidationError, match="30 s"):
        validate(job)
    del job["spec"]["template"]["spec"]["tolerations"][0]["tolerationSeconds"]
    del job["spec"]["template"]["spec"]["containers"][0]["name"]
    with pytest.raises(kubernetes_validate.ValidationError, match="'name' is a required"):
        validate(job)


def test_the_operations_guide_points_at_the_files_and_this_test() -> None:
    text = (ROOT / "docs" / "operations.md").read_text("utf-8")
    section = text[text.index("### Kubernetes") :]
    for name in (
        "deploy/k8s/values.yaml",
        "deploy/k8s/backfill-settings.yaml",
        "deploy/k8s/backfill-secrets.example.yaml",
        "backfill_tests/deploy/test_k8s_manifests.py",
        "backfill-settings",
        "backfill-secrets",
        "dagster-postgresql-secret",
        "registry.example.com/backfill-moderation:1",
        "K8sRunLauncher",
    ):
        assert name in section, name
