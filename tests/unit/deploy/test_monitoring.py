"""The monitoring components (deploy/k8s/components/monitoring*): scraping, alerts and the Grafana dashboard.

Every metric name an alert or a dashboard query uses must be one the services export: the names are taken
from the services' own registries (`devsched.*.metrics.REGISTRY`), never listed here.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from devsched.agent.metrics import REGISTRY as AGENT
from devsched.scheduler.metrics import REGISTRY as SCHEDULER
from devsched.service.metrics import exported_names
from devsched.sweeper.metrics import REGISTRY as SWEEPER
from unit.deploy.manifests import K8S, KUBERNETES_VERSION, _kustomize, containers, find, pod_spec

pytestmark = pytest.mark.unit

MONITORING = K8S / "components" / "monitoring"
#: A metric name in PromQL: ours, or the process collector's.
NAME = re.compile(r"\b((?:devsched|process)_[a-z0-9_]+)\b")
#: Exported families the dashboard may leave out (bookkeeping, not operations).
NOT_ON_THE_DASHBOARD = {"devsched_gauges_refreshed_timestamp_seconds", "devsched_pruned_tasks_total"}
ALERTS = {
    "DevschedNoSchedulerReady",
    "DevschedOutboxLag",
    "DevschedLeaseExpirationSpike",
    "DevschedQueueAge",
    "DevschedHostsOffline",
    "DevschedDevicesQuarantined",
}


def exported() -> frozenset[str]:
    return exported_names(SCHEDULER) | exported_names(SWEEPER) | exported_names(AGENT)


def _with_component(tmp_path: Path, overlay: str, component: str, namespace: str) -> list[dict[str, Any]]:
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "namespace": namespace,
                "resources": [os.path.relpath(K8S / "overlays" / "production" / overlay, tmp_path)],
                "components": [os.path.relpath(K8S / "components" / component, tmp_path)],
            }
        )
    )
    return _kustomize(tmp_path)


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In"
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


@pytest.mark.parametrize(
    ("overlay", "component", "namespace", "workloads"),
    [
        ("control-plane", "monitoring", "devsched", [("Deployment", "devsched-scheduler"),
                                                     ("Deployment", "devsched-sweeper")]),
        ("agent", "monitoring-agent", "devsched-agents", [("DaemonSet", "devsched-agent")]),
    ],
)  # fmt: skip
def test_the_pod_monitor_and_the_scrape_policy_reach_every_service_on_its_metrics_port(
    tmp_path: Path, overlay: str, component: str, namespace: str, workloads: list[tuple[str, str]]
) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = _with_component(tmp_path, overlay, component, namespace)
    (monitor,) = [d for d in docs if d["kind"] == "PodMonitor"]
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-scrape")]
    kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)
    assert monitor["metadata"]["namespace"] == policy["metadata"]["namespace"] == namespace
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    for kind, name in workloads:
        workload = find(docs, kind, name)
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert _matches(monitor["spec"]["selector"], labels), name
        assert _matches(policy["spec"]["podSelector"], labels), name
        ports = {p["name"] for c in containers(pod_spec(workload)) for p in c.get("ports", [])}
        assert endpoint["port"] in ports, name
        assert {"protocol": "TCP", "port": endpoint["port"]} in policy["spec"]["ingress"][0]["ports"]


def test_the_alerts_are_the_issues_and_use_exported_metrics(tmp_path: Path) -> None:
    docs = _with_component(tmp_path, "control-plane", "monitoring", "devsched")
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    rules = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert {r["alert"] for r in rules} == ALERTS
    names = exported()
    for r in rules:
        used = set(NAME.findall(r["expr"]))
        assert used, r["alert"]
        assert used <= names, (r["alert"], used - names)
        assert r["labels"]["severity"] in {"warning", "critical"}
        assert r["annotations"]["summary"]


def test_the_dashboard_queries_exported_metrics_and_shows_each_of_them(tmp_path: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = _with_component(tmp_path, "control-plane", "monitoring", "devsched")
    (config_map,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "devsched-grafana-dashboard"
    ]
    kubernetes_validate.validate(config_map, KUBERNETES_VERSION, strict=True)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["devsched.json"])
    assert dashboard == json.loads((MONITORING / "dashboard.json").read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    names = exported()
    used: set[str] = set()
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            found = set(NAME.findall(target["expr"]))
            assert found, panel["title"]
            assert found <= names, (panel["title"], found - names)
            used |= found
    families = {n for n in names if n.startswith("devsched_") and not n.endswith(("_created", "_sum", "_count"))}
    shown = {n.removesuffix("_bucket") for n in used} | used
    missing = {n for n in families if n.removesuffix("_bucket") not in shown} - NOT_ON_THE_DASHBOARD
    assert not missing, missing
