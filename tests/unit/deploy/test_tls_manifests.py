"""Credentials from files and TLS in the manifests: no agent password in an environment, cert-manager
certificates, mutual TLS to NATS and verified Postgres in production."""

from __future__ import annotations

from typing import Any

import pytest

from devsched.scheduler.settings import SchedulerSettings
from devsched.service.settings import ENV_PREFIX

from .manifests import (
    OVERLAYS,
    config_map,
    find,
    pod_spec,
    render,
    workloads,
)

pytestmark = pytest.mark.unit


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
        "devsched-web-tls",
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
        "devsched-web": TLS_ENV,  # NATS only: the dashboard never connects to Postgres
    }
    for workload in workloads(docs):
        spec = pod_spec(workload)
        (container,) = spec["containers"]
        env = {entry["name"]: entry.get("value", "") for entry in container.get("env", [])}
        for setting in expected[workload["metadata"]["labels"]["app.kubernetes.io/name"]]:
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
    assert SchedulerSettings.model_validate(values).uses_tls_files


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
