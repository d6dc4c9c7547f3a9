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
from unit.deploy.manifests import K8S, KUBERNETES_VERSION, _kustomize, containers, find, pod_spec, render
from unit.docs.test_links import ROOT, anchors

pytestmark = pytest.mark.unit

MONITORING = K8S / "components" / "monitoring"
#: A metric name in PromQL: ours, or the process collector's.
NAME = re.compile(r"\b((?:devsched|process)_[a-z0-9_]+)\b")
#: Exported families the dashboard may leave out (bookkeeping, not operations).
NOT_ON_THE_DASHBOARD = {
    "devsched_gauges_refreshed_timestamp_seconds",
    "devsched_pruned_tasks_total",
    "devsched_build_info",
}
#: Where the alerts' runbooks are: docs/runbooks.md, served under this base (replaced in an overlay).
RUNBOOKS = ROOT / "docs" / "runbooks.md"
RUNBOOK_BASE = "https://devsched.example.com/docs/runbooks.md"
ALERTS = {
    "DevschedNoSchedulerReady",
    "DevschedOutboxLag",
    "DevschedLeaseExpirationSpike",
    "DevschedQueueAge",
    "DevschedHostsOffline",
    "DevschedDevicesQuarantined",
    "DevschedPostgresWALArchivingFailing",
}
#: CloudNativePG's metrics the alerts use (its default monitoring queries; the PodMonitor devsched-pg).
CNPG_METRICS = {"cnpg_pg_stat_archiver_failed_count"}
CNPG_NAME = re.compile(r"\b(cnpg_[a-z0-9_]+)\b")


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
    (monitor,) = [d for d in docs if d["kind"] == "PodMonitor" and d["metadata"]["name"] != "devsched-pg"]
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
    names = exported() | CNPG_METRICS
    for r in rules:
        used = set(NAME.findall(r["expr"])) | set(CNPG_NAME.findall(r["expr"]))
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


#: A metric selector in PromQL: the metric name and its label matchers, if any.
SELECTOR = re.compile(r"\b((?:devsched|process)_[a-z0-9_]+)\b(\{[^}]*\})?")
#: The namespace matcher each selector must carry: the agents' metrics the agents' namespace, the control
#: plane's its own, the process collector's (every component) either.
CONTROL_PLANE, AGENTS, EITHER = '"$namespace"', '"$agent_namespace"', '"$namespace|$agent_namespace"'


def _namespace_variable(name: str, matchers: str) -> str:
    if name.startswith("process_"):
        return EITHER
    if name.startswith("devsched_agent_") or 'component="agent"' in matchers:
        return AGENTS
    return CONTROL_PLANE


def test_every_panel_query_filters_by_the_namespace_variables() -> None:
    """One Prometheus often scrapes several deployments (dev and production): every query is one's."""
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for name in ("namespace", "agent_namespace"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"]["uid"] == "${datasource}"
        assert "namespace)" in variables[name]["definition"], "it lists the namespaces the metrics come from"
    unfiltered = []
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            selectors = SELECTOR.findall(target["expr"])
            assert selectors, panel["title"]
            for name, matchers in selectors:
                want = f"namespace=~{_namespace_variable(name, matchers)}"
                if want not in matchers:
                    unfiltered.append((panel["title"], name, want))
    assert unfiltered == []


def test_the_namespace_check_finds_a_query_without_the_filter() -> None:
    assert SELECTOR.findall('sum(rate(devsched_reports_total[5m])) / max(devsched_hosts{namespace=~"$namespace"})') == [
        ("devsched_reports_total", ""),
        ("devsched_hosts", '{namespace=~"$namespace"}'),
    ]
    assert _namespace_variable("devsched_agent_spool_reports", "") == AGENTS
    assert _namespace_variable("devsched_ready", '{component="agent"}') == AGENTS
    assert _namespace_variable("devsched_ready", '{component="scheduler"}') == CONTROL_PLANE


def test_every_alert_links_its_runbook_section(tmp_path: Path) -> None:
    docs = _with_component(tmp_path, "control-plane", "monitoring", "devsched")
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    rules = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    sections = anchors(RUNBOOKS)
    missing = []
    for r in rules:
        url = r["annotations"].get("runbook_url", "")
        base, _, anchor = url.partition("#")
        if base != RUNBOOK_BASE or anchor not in sections:
            missing.append((r["alert"], url))
    assert missing == [], f"each alert needs a runbook_url to its section of {RUNBOOKS.relative_to(ROOT)}"
    # and every section of the runbooks is an alert's: none left behind when an alert goes
    assert {r["alert"].lower() for r in rules} == sections - {"runbooks"}


def test_the_database_is_scraped_by_its_own_pod_monitor(tmp_path: Path) -> None:
    docs = _with_component(tmp_path, "control-plane", "monitoring", "devsched")
    monitor = find(docs, "PodMonitor", "devsched-pg")
    assert monitor["metadata"]["namespace"] == "devsched", "beside the Cluster"
    assert monitor["spec"]["selector"] == {"matchLabels": {"cnpg.io/cluster": "devsched-pg"}}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"  # CloudNativePG's exporter, 9187
    cluster = find(render("overlays/production/postgres"), "Cluster", "devsched-pg")
    assert cluster["metadata"]["namespace"] == monitor["metadata"]["namespace"]
    # the archiving alert reads this monitor's pods
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    (archiving,) = [r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"].startswith("DevschedPostgres")]
    assert 'pod=~"devsched-pg-[0-9]+"' in archiving["expr"]
