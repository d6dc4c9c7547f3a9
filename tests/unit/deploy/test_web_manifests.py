"""The web dashboard's deployment: its NATS user (reads, and only the actions it offers) and the opt-in
kustomize components (`components/web`, `components/web-ingress`) rendered over the production overlay."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from devsched.protocol.subjects import Subjects
from devsched.service.settings import ENV_PREFIX
from devsched.web.settings import WebSettings

from .manifests import DEPLOY, K8S, KUBERNETES_VERSION, _kustomize, containers, environment, find, pod_spec

pytestmark = pytest.mark.unit


def _web_user(accounts: str) -> str:
    start = accounts.index('user: "web"')
    return accounts[start : accounts.index("\n      }\n", start)]


def test_the_web_nats_user_may_read_cancel_and_drain_and_nothing_else() -> None:
    block = _web_user((DEPLOY / "nats" / "accounts.conf").read_text())
    published = set(re.findall(r'^\s*"([^"]+)"\s*$', block.split("subscribe:")[0], flags=re.MULTILINE))
    s = Subjects("devsched")
    api = {subject for subject in published if subject.startswith("devsched.")}
    assert api == {s.tasks_get, s.tasks_list, s.tasks_cancel, s.hosts_list, s.devices_drain, s.task_artifacts}
    assert s.tasks_submit not in published
    assert s.hosts_drain not in published
    others = published - api
    assert all(subject.startswith(("$JS.API.", "$JS.FC.")) for subject in others), others
    assert not any("ASSIGNMENTS" in subject or "STREAM.CREATE" in subject for subject in others)
    # the artifacts bucket is read (downloads), never written: no `$O.` publish, no purge or delete
    assert not any(subject.startswith("$O.") or "PURGE" in subject or ".MSG.DELETE" in subject for subject in others)
    assert 'password: "$2a$11$REPLACE' in block
    assert "devsched.host." not in block


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    where = tmp_path_factory.mktemp("web-overlay")
    (where / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(K8S / "overlays" / "production", where)],
                "components": [
                    os.path.relpath(K8S / "components" / "web", where),
                    os.path.relpath(K8S / "components" / "web-ingress", where),
                ],
            }
        )
    )
    return _kustomize(Path(where))


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
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    names = environment(rendered, web, container)
    known = {ENV_PREFIX + name.upper() for name in WebSettings.model_fields}
    for name in names:
        assert not name.startswith(ENV_PREFIX) or name in known, name
    assert "DEVSCHED_DATABASE_URL" not in {e["name"] for e in container["env"]}
    values = {e["name"]: e.get("value") for e in container["env"]}
    assert values["DEVSCHED_WEB_ACTIONS"] == "false"  # read-only unless an operator turns it on
    assert values["DEVSCHED_NATS_URL"].startswith("nats://web:$(NATS_PASSWORD)@")
    secrets = {e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "valueFrom" in e}
    assert secrets == {"devsched-nats", "devsched-web-token"}
    assert not any(d["kind"] == "Secret" and "web" in d["metadata"]["name"] for d in rendered)


def test_the_web_settings_agree_with_the_shared_ones(rendered: list[dict[str, Any]]) -> None:
    shared = dict(
        line.split("=", 1)
        for line in (K8S / "base" / "settings" / "settings.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    (container,) = containers(pod_spec(find(rendered, "Deployment", "devsched-web")))
    values = {e["name"]: e.get("value") for e in container["env"]}
    for name in ("DEVSCHED_SUBJECT_PREFIX", "NATS_ADDRESS"):
        assert values[name] == shared[name], name


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
