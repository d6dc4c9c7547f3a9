"""The manifests rendered and checked as Kubernetes objects: validity, pods, replicas, the agent,
environment, labels and network policies (validated strictly against Kubernetes 1.32 with
`kubernetes-validate`; custom resources have no schema there and are skipped by name)."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from devsched.agent.agent import DRAIN_SIGNAL
from devsched.agent.config import AgentConfig, parse_config
from devsched.scheduler.settings import SchedulerSettings
from devsched.service.settings import ENV_PREFIX, ServiceSettings
from devsched.sweeper.app import SweeperSettings

from .manifests import (
    AGENT_SPOOL,
    CUSTOM_RESOURCE_GROUPS,
    DEPLOY,
    HELPER_ENV,
    HTTP_FACING,
    K8S,
    KUBERNETES_VERSION,
    KUSTOMIZATIONS,
    OVERLAYS,
    REFERENCED_SECRETS,
    ROOT,
    SETTINGS_OF,
    SHARED_ENV,
    _group,
    _kustomize,
    agent_shutdown_s,
    component,
    config_map,
    containers,
    environment,
    find,
    pod_spec,
    render,
    settings_env,
    workloads,
)

pytestmark = pytest.mark.unit


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


def _image_tag(workload: dict[str, Any]) -> str:
    return str(pod_spec(workload)["containers"][0]["image"]).rsplit(":", 1)[1]


def _migration_job(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (job,) = [d for d in workloads(docs) if d["metadata"]["labels"]["app.kubernetes.io/name"] == "devsched-migrate"]
    return job


def test_the_migration_job_runs_the_schedulers_migrate_flag() -> None:
    job = _migration_job(render("overlays/production"))
    (container,) = pod_spec(job)["containers"]
    assert container["args"] == ["devsched-scheduler", "--migrate"]
    assert pod_spec(job)["restartPolicy"] in {"OnFailure", "Never"}
    source = (ROOT / "services" / "scheduler" / "src" / "devsched" / "scheduler" / "main.py").read_text()
    assert '"--migrate"' in source


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_release_runs_its_own_migration_job_named_after_the_image_tag(overlay: str) -> None:
    """A new tag is a new Job, which `kubectl apply` creates: no Job to delete by hand before a release."""
    docs = render(overlay)
    tag = _image_tag(find(docs, "Deployment", "devsched-scheduler"))
    job = _migration_job(docs)
    assert job["metadata"]["name"] == f"devsched-migrate-{tag}"
    assert _image_tag(job) == tag
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", job["metadata"]["name"])
    assert len(job["metadata"]["name"]) <= 63  # the pods' job-name label
    assert pod_spec(job)["hostname"] == "devsched-migrate"  # a DNS label, whatever dots the tag has
    assert job["spec"]["ttlSecondsAfterFinished"] > 0  # finished releases' Jobs go by themselves


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_workload_carries_its_version_and_the_instance(overlay: str) -> None:
    docs = render(overlay)
    namespace = find(docs, "Deployment", "devsched-scheduler")["metadata"]["namespace"]
    for workload in workloads(docs):
        tag = _image_tag(workload)
        for labels in (workload["metadata"]["labels"], workload["spec"]["template"]["metadata"]["labels"]):
            assert labels["app.kubernetes.io/version"] == tag, workload["metadata"]["name"]
            assert labels["app.kubernetes.io/instance"] == namespace, workload["metadata"]["name"]
        # never in a selector: a selector is immutable, and a version in it would break every upgrade
        selector = workload["spec"].get("selector", {}).get("matchLabels", {})
        assert "app.kubernetes.io/version" not in selector


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
    for name in ("devsched-scheduler", "devsched-sweeper", "devsched-web"):
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
        assert strategy["maxUnavailable"] == 0, "never stop an old pod before a new one is ready"
        assert deployment["spec"]["minReadySeconds"] > 0


@pytest.mark.parametrize("name", [*OVERLAYS, "base/control-plane", "base/agent"])
def test_every_service_container_is_probed_on_its_health_port(name: str) -> None:
    """Liveness on /healthz and readiness on /readyz, on the named port the service listens on (its env)."""
    docs = render(name)
    probed = 0
    for workload in workloads(docs):
        if workload["kind"] == "Job":  # the migration runs to completion: nothing to probe
            assert all("readinessProbe" not in c for c in containers(pod_spec(workload)))
            continue
        (container,) = pod_spec(workload)["containers"]
        where = f"{name}: {workload['metadata']['name']}"
        env = {entry["name"]: entry.get("value") for entry in container.get("env", [])}
        ports = {port["name"]: port for port in container.get("ports", [])}
        assert "metrics" in ports, f"{where}: no port named metrics"
        assert ports["metrics"]["protocol"] == "TCP"
        assert int(env["DEVSCHED_METRICS_PORT"]) == ports["metrics"]["containerPort"], where
        assert env["DEVSCHED_METRICS_HOST"] == "0.0.0.0", f"{where}: the kubelet probes the pod's address"
        for kind, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            probe = container[kind]
            assert probe["httpGet"] == {"path": path, "port": "metrics"}, f"{where}: {kind}"
            # the service bounds each check to 3 s: the kubelet must wait longer than that
            assert probe["timeoutSeconds"] >= 5, f"{where}: {kind}"
            assert probe["periodSeconds"] >= 5, f"{where}: {kind}"
        liveness = container["livenessProbe"]
        patience = liveness["periodSeconds"] * liveness["failureThreshold"]
        assert patience >= (180 if component(workload) == "agent" else 60), f"{where}: liveness too eager"
        assert "startupProbe" not in container, f"{where}: the listener is up before anything slow starts"
        probed += 1
    assert probed, f"{name}: no workload probed"
    settings = ServiceSettings(metrics_port=9464, metrics_host="0.0.0.0")  # the values are valid settings
    assert settings.metrics_port == 9464
    assert AgentConfig.model_fields["metrics_port"].default is None  # off unless a deployment asks


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
        elif component(workload) == "web":  # uvicorn's graceful shutdown (main.py), then the NATS drain
            assert grace >= WEB_SHUTDOWN_S + drain + 10
        else:
            hosts = config_map(docs, workload["metadata"]["namespace"], "devsched-agent-hosts")
            drain_wait = float(env["DRAIN_WAIT_S"])
            for key, text in hosts.items():
                if key.endswith(".toml"):
                    agent = parse_config(tomllib.loads(text), source=key)
                    assert grace >= agent_shutdown_s(agent, drain_wait) + 10, key


#: Seconds uvicorn gives open requests at shutdown (`timeout_graceful_shutdown` in devsched.web.main).
WEB_SHUTDOWN_S = 2


@pytest.mark.parametrize("name", [*OVERLAYS, "base/agent"])
def test_the_agent_is_drained_before_it_is_stopped(name: str) -> None:
    agent = find(render(name), "DaemonSet", "devsched-agent")
    (container,) = pod_spec(agent)["containers"]
    hook = container["lifecycle"]["preStop"]["exec"]["command"]
    script = hook[-1]
    assert hook[:2] == ["/bin/sh", "-c"]
    # SIGUSR1 to PID 1 (tini, which forwards it to the agent: DRAIN_SIGNAL), then a bounded wait for its exit
    assert script.startswith("kill -USR1 1")
    assert '"$DRAIN_WAIT_S"' in script
    assert "kill -0 1" in script
    assert "$(" not in script, "the kubelet would expand it"
    assert DRAIN_SIGNAL.name == "SIGUSR1"
    env = {entry["name"]: entry.get("value") for entry in container["env"]}
    assert float(env["DRAIN_WAIT_S"]) == AgentConfig.model_fields["shutdown_grace_s"].default


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
        # the shared environment is every service's: each reads its own settings in it and ignores the others
        known = settings_env(settings_type) | (SHARED_ENV & set().union(*map(settings_env, SETTINGS_OF.values())))
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
        "web": {"DEVSCHED_NATS_URL", "DEVSCHED_SUBJECT_PREFIX", "DEVSCHED_WEB_HOST", "DEVSCHED_WEB_PORT"},
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
def test_network_policies_allow_no_ingress_and_only_nats_postgres_dns_and_collector_egress(name: str) -> None:
    """No ingress, except to the HTTP port of an HTTP-facing component (the dashboard); the dashboard's egress
    is NATS and DNS only (no database, no traces)."""
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
        kind = component(workload)
        if kind in HTTP_FACING:
            (container,) = pod_spec(workload)["containers"]
            (http,) = [port for port in container["ports"] if port["name"] == HTTP_FACING[kind]]
            (rule,) = policy["spec"]["ingress"]
            assert rule["ports"] == [{"protocol": "TCP", "port": http["containerPort"]}], workload["metadata"]["name"]
            assert set(rule) <= {"ports", "from"}
        else:
            assert policy["spec"]["ingress"] == [], workload["metadata"]["name"]
        ports = {port["port"] for rule in policy["spec"]["egress"] for port in rule["ports"]}
        otlp = {4318, 4317}  # the OpenTelemetry Collector, where traces go
        expected = {
            "agent": {4222, 53} | otlp,
            "web": {4222, 53},  # an operator client over NATS: never the database
        }.get(kind, {4222, 5432, 53} | otlp)
        assert ports == expected, workload["metadata"]["name"]
        for rule in policy["spec"]["egress"]:
            assert rule["to"], "an empty `to` would allow every destination"
