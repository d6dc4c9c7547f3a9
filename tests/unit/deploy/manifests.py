"""Rendering and reading the deployment manifests under deploy/, for the tests of this folder.

Each kustomization is rendered with `kubectl kustomize` (offline; a test is skipped when kubectl is
missing). The environment names are checked against the services' own settings classes (imported, not
listed), so a renamed setting fails here rather than silently at deploy time.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devsched.agent.config import AgentConfig, EnvOverrides
from devsched.scheduler.settings import SchedulerSettings
from devsched.service.settings import ENV_PREFIX
from devsched.sweeper.app import SweeperSettings
from devsched.web.settings import WebSettings

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
    "DRAIN_WAIT_S",
}
#: Secrets the manifests may reference (they are created by operators or by CloudNativePG, never here).
REFERENCED_SECRETS = {
    "devsched-pg-app",
    "devsched-pg-owner",
    "devsched-pg-scheduler",
    "devsched-pg-sweeper",
    "devsched-nats",
    "devsched-agent-nats",
    "devsched-web-token",  # the dashboard's operator token (optional: read only with actions on)
}
#: Secrets that cert-manager writes for the production overlay's Certificates (checked by the TLS tests below).
REFERENCED_SECRETS |= {"devsched-scheduler-tls", "devsched-sweeper-tls", "devsched-migrate-tls", "devsched-web-tls"}
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


#: The environment every control-plane workload is handed (`base/settings/settings.env`): each service reads
#: the settings it has and ignores the others (the dashboard has no database, sweep or payload settings).
SHARED_ENV = {
    line.split("=", 1)[0]
    for line in (K8S / "base" / "settings" / "settings.env").read_text().splitlines()
    if "=" in line and not line.startswith("#")
}


#: Which settings class reads the environment of each component's container.
SETTINGS_OF = {
    "scheduler": SchedulerSettings,
    "migration": SchedulerSettings,  # `devsched-scheduler --migrate`
    "sweeper": SweeperSettings,
    "agent": EnvOverrides,  # the agent reads only these over its agent.toml
    "web": WebSettings,  # devsched-web, the dashboard (components/web)
}
#: The components that serve HTTP over the pod network, by the name of the container port that does: the
#: only ones whose NetworkPolicy admits ingress, and only to that port (the others serve nothing but probes).
HTTP_FACING = {"web": "http"}


def agent_shutdown_s(agent: AgentConfig, drain_wait_s: float) -> float:
    """The longest an agent pod takes to go, preStop hook included (the phases of the agent's shutdown.py).

    The hook drains for up to `drain_wait_s`; SIGTERM then finds the shutdown grace (counted from the drain)
    spent or gives what is left of it; then withdrawing the devices (one request), the stop at the step
    boundary (two stop graces and a request), the kill (a stop grace and a request), the last deliveries
    (a request and a second), the last look at the consumer, and the NATS drain.
    """
    stop, request = agent.stop_grace_s, agent.request_timeout_s
    phases = request + (2 * stop + request) + (stop + request) + (request + 1)
    last_look = 1 + request  # SWEEP_WAIT_S, bounded by a request timeout more
    return max(drain_wait_s, agent.shutdown_grace_s) + phases + last_look + agent.drain_timeout_s
