"""The web dashboard's deployment: its NATS user (reads, and only the actions it offers), the component
`components/web` as both overlays include it, and the opt-in `components/web-ingress` added to the production
control plane. (The general checks of test_kubernetes.py cover it too, as one of the overlays' workloads.)"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from devsched.protocol import endpoints
from devsched.protocol.subjects import Subjects
from devsched.service.settings import ENV_PREFIX
from devsched.web import hosts
from devsched.web.app import allowed_hosts
from devsched.web.settings import WebSettings

from .manifests import (
    DEPLOY,
    K8S,
    KUBERNETES_VERSION,
    OVERLAYS,
    SHARED_ENV,
    _kustomize,
    config_map,
    containers,
    environment,
    find,
    pod_spec,
    render,
)

pytestmark = pytest.mark.unit


def _web_user(accounts: str) -> str:
    start = accounts.index('user: "web"')
    return accounts[start : accounts.index("\n      }\n", start)]


def test_the_web_nats_user_may_read_cancel_resubmit_and_drain_and_nothing_else() -> None:
    block = _web_user((DEPLOY / "nats" / "accounts.conf").read_text())
    published = set(re.findall(r'^\s*"([^"]+)"\s*$', block.split("subscribe:")[0], flags=re.MULTILINE))
    s = Subjects("devsched")
    api = {subject for subject in published if subject.startswith("devsched.")}
    assert api == {
        s.endpoint(endpoints.TASKS_GET),
        s.endpoint(endpoints.TASKS_LIST),
        s.endpoint(endpoints.TASKS_CANCEL),
        s.endpoint(endpoints.TASKS_SUBMIT),  # resubmit from the Task page is a submit
        s.endpoint(endpoints.HOSTS_LIST),
        s.endpoint(endpoints.DEVICES_DRAIN),
        s.endpoint(endpoints.TASKS_ARTIFACTS),
    }
    assert s.endpoint(endpoints.HOSTS_DRAIN) not in published
    assert s.endpoint(endpoints.DEVICES_FORGET) not in published  # operators only
    assert s.endpoint(endpoints.DEVICES_LABEL) not in published
    others = published - api
    # logouts: its own bucket of revoked sessions, written and followed, nothing else of it (the scheduler makes it)
    revoked = s.web_revoked_bucket
    assert {subject for subject in others if revoked in subject} == {
        f"$KV.{revoked}.>",
        f"$JS.API.STREAM.INFO.KV_{revoked}",
        f"$JS.API.CONSUMER.CREATE.KV_{revoked}",
        f"$JS.API.CONSUMER.INFO.KV_{revoked}.*",
    }
    others -= {f"$KV.{revoked}.>"}
    assert all(subject.startswith(("$JS.API.", "$JS.FC.")) for subject in others), others
    assert not any(verb in subject for subject in others for verb in ("STREAM.UPDATE", "STREAM.DELETE", "MSG.DELETE"))
    assert not any("ASSIGNMENTS" in subject or "STREAM.CREATE" in subject for subject in others)
    # the artifacts bucket is read (downloads), never written: no `$O.` publish, no purge or delete
    assert not any(subject.startswith("$O.") or "PURGE" in subject or ".MSG.DELETE" in subject for subject in others)
    assert 'password: "$2a$11$REPLACE' in block
    # step output: consumers whose create request names a log filter (the server holds them to it)
    log_consumers = f"$JS.API.CONSUMER.CREATE.*.*.{s.host_log_all}"
    assert log_consumers in others
    assert "devsched.host." not in block.replace(log_consumers, "")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    where = tmp_path_factory.mktemp("web-overlay")
    (where / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "namespace": "devsched",
                "resources": [os.path.relpath(K8S / "overlays" / "production" / "control-plane", where)],
                "components": [os.path.relpath(K8S / "components" / "web-ingress", where)],
            }
        )
    )
    return _kustomize(Path(where))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_both_overlays_run_the_dashboard_read_only_beside_the_control_plane(overlay: str) -> None:
    docs = render(overlay)
    web = find(docs, "Deployment", "devsched-web")
    scheduler = find(docs, "Deployment", "devsched-scheduler")
    assert web["metadata"]["namespace"] == scheduler["metadata"]["namespace"]
    (container,) = containers(pod_spec(web))
    values = {e["name"]: e.get("value") for e in container["env"]}
    assert values["DEVSCHED_WEB_ACTIONS"] == "false"
    assert container["image"] == pod_spec(scheduler)["containers"][0]["image"], "one release"
    assert not [d for d in docs if d["kind"] == "Ingress"], "the Ingress stays opt-in (components/web-ingress)"


def test_the_web_manifests_validate_strictly(rendered: list[dict[str, Any]]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for kind in ("Deployment", "Service", "NetworkPolicy", "Ingress", "ServiceAccount", "PodDisruptionBudget"):
        kubernetes_validate.validate(find(rendered, kind, "devsched-web"), KUBERNETES_VERSION, strict=True)


def test_the_web_deployment_is_read_only_non_root_probed_and_never_sees_the_database(
    rendered: list[dict[str, Any]],
) -> None:
    web = find(rendered, "Deployment", "devsched-web")
    spec = pod_spec(web)
    assert spec["securityContext"]["runAsNonRoot"] is True
    (container,) = containers(spec)
    assert container["args"][-1] == "devsched-web"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    names = environment(rendered, web, container)
    known = {ENV_PREFIX + name.upper() for name in WebSettings.model_fields} | SHARED_ENV  # the rest it ignores
    for name in names:
        assert not name.startswith(ENV_PREFIX) or name in known, name
    assert "DEVSCHED_DATABASE_URL" not in {e["name"] for e in container["env"]}
    values = {e["name"]: e.get("value") for e in container["env"]}
    assert values["DEVSCHED_WEB_ACTIONS"] == "false"  # read-only unless an operator turns it on
    assert values["DEVSCHED_NATS_URL"].startswith("nats://web:$(NATS_PASSWORD)@")
    secrets = {e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "valueFrom" in e}
    assert secrets == {"devsched-nats", "devsched-web-token"}
    assert container["env"][[e["name"] for e in container["env"]].index("DEVSCHED_WEB_TOKEN")]["valueFrom"][
        "secretKeyRef"
    ]["optional"], "a read-only dashboard needs no token Secret"
    assert not any(d["kind"] == "Secret" and "web" in d["metadata"]["name"] for d in rendered)


def test_the_web_reads_the_shared_settings_and_they_are_valid_web_settings(rendered: list[dict[str, Any]]) -> None:
    web = find(rendered, "Deployment", "devsched-web")
    (container,) = containers(pod_spec(web))
    shared = config_map(rendered, web["metadata"]["namespace"], "devsched-settings")
    assert [source["configMapRef"]["name"] for source in container["envFrom"]] == [
        d["metadata"]["name"]
        for d in rendered
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("devsched-settings")
    ]
    assert {"DEVSCHED_SUBJECT_PREFIX", "NATS_ADDRESS"} <= set(shared)
    values = {k.removeprefix(ENV_PREFIX).lower(): v for k, v in shared.items() if k.startswith(ENV_PREFIX)}
    values |= {
        e["name"].removeprefix(ENV_PREFIX).lower(): e["value"]
        for e in container["env"]
        if e["name"].startswith(ENV_PREFIX) and "$(" not in e.get("value", "$(")
    }
    settings = WebSettings.model_validate(values)
    assert (settings.web_port, settings.loopback, settings.metrics_port) == (8080, False, 9464)


def test_the_web_network_policy_admits_only_its_port_and_reaches_only_nats_and_dns(
    rendered: list[dict[str, Any]],
) -> None:
    policy = find(rendered, "NetworkPolicy", "devsched-web")["spec"]
    assert [p["port"] for rule in policy["ingress"] for p in rule["ports"]] == [8080]
    egress_ports = sorted(p["port"] for rule in policy["egress"] for p in rule["ports"])
    assert egress_ports == [53, 53, 4222]  # no Postgres
    service = find(rendered, "Service", "devsched-web")
    ingress = find(rendered, "Ingress", "devsched-web")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"]


def test_the_web_answers_only_its_names_and_behind_the_ingress_its_host_with_secure_cookies(
    rendered: list[dict[str, Any]],
) -> None:
    """DNS rebinding: the pods answer the Service's and a port-forward's names, plus the Ingress's host
    when `components/web-ingress` is in (which also believes its proxy and forces Secure cookies)."""
    for overlay in OVERLAYS:
        (container,) = containers(pod_spec(find(render(overlay), "Deployment", "devsched-web")))
        values = {e["name"]: e.get("value") for e in container["env"]}
        entries = hosts.parse(values["DEVSCHED_WEB_ALLOWED_HOSTS"])
        assert hosts.allowed(entries, "localhost:8080", "http")  # kubectl port-forward
        assert not hosts.allowed(entries, "devsched.example.com", "https")
        assert "DEVSCHED_WEB_FORWARDED_ALLOW_IPS" not in values
    (container,) = containers(pod_spec(find(rendered, "Deployment", "devsched-web")))
    values = {e["name"]: e.get("value") for e in container["env"]}
    settings = WebSettings.model_validate({k.removeprefix(ENV_PREFIX).lower(): v for k, v in values.items() if v})
    (ingress,) = [d for d in rendered if d["kind"] == "Ingress"]
    host = ingress["spec"]["rules"][0]["host"]
    assert hosts.allowed(allowed_hosts(settings), host, "https")
    assert not hosts.allowed(allowed_hosts(settings), "evil.example", "https")
    assert settings.web_secure_cookies
    assert settings.web_forwarded_allow_ips
