"""Day-2 operations of the CloudNativePG Cluster: backups, restore, the optional pooler.

The components (deploy/k8s/components/postgres-backup, postgres-recovery, postgres-pooler) are rendered
with `kubectl kustomize` on the production overlays they are meant for; their custom resources are checked
by hand (no schema offline), the Kubernetes objects they change against Kubernetes' own.
"""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from unit.deploy.manifests import K8S, KUBERNETES_VERSION, _kustomize, containers, find, pod_spec, render

pytestmark = pytest.mark.unit

PLUGIN = "barman-cloud.cloudnative-pg.io"
CLUSTER = "devsched-pg"


def _with(tmp_path: Path, overlay: str, *components: str) -> list[dict[str, Any]]:
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "namespace": "devsched",
                "resources": [os.path.relpath(K8S / "overlays" / "production" / overlay, tmp_path)],
                "components": [os.path.relpath(K8S / "components" / c, tmp_path) for c in components],
            }
        )
    )
    return _kustomize(tmp_path)


def _env(container: dict[str, Any]) -> dict[str, str | None]:
    return {entry["name"]: entry.get("value") for entry in container.get("env", [])}


def test_backups_archive_the_wal_and_run_every_night(tmp_path: Path) -> None:
    docs = _with(tmp_path, "postgres", "postgres-backup")
    cluster = find(docs, "Cluster", CLUSTER)
    store = find(docs, "ObjectStore", "devsched-pg-backups")
    scheduled = find(docs, "ScheduledBackup", "devsched-pg-nightly")
    assert store["apiVersion"] == "barmancloud.cnpg.io/v1"
    assert {d["metadata"]["namespace"] for d in (cluster, store, scheduled)} == {"devsched"}
    # the Cluster archives its WAL into that store, under its own name
    (plugin,) = cluster["spec"]["plugins"]
    assert plugin == {"name": PLUGIN, "isWALArchiver": True, "parameters": {"barmanObjectName": "devsched-pg-backups"}}
    assert "backup" not in cluster["spec"], "not the deprecated in-tree barmanObjectStore as well"
    # the bootstrap of postgres-roles is untouched
    assert set(cluster["spec"]["bootstrap"]) == {"initdb"}
    configuration = store["spec"]["configuration"]
    assert configuration["destinationPath"].startswith("s3://")
    credentials = configuration["s3Credentials"]
    assert {ref["name"] for ref in credentials.values()} == {"devsched-pg-backup-s3"}
    assert store["spec"]["retentionPolicy"] == "30d"
    # the schedule: CloudNativePG's six fields (seconds first), through the plugin, of this Cluster
    spec = scheduled["spec"]
    assert len(spec["schedule"].split()) == 6
    assert spec["cluster"] == {"name": CLUSTER}
    assert spec["method"] == "plugin"
    assert spec["pluginConfiguration"] == {"name": PLUGIN}
    assert spec["backupOwnerReference"] == "self"
    assert spec["immediate"] is True


def test_a_restore_recovers_from_the_backups_and_archives_under_a_new_name(tmp_path: Path) -> None:
    docs = _with(tmp_path, "postgres", "postgres-roles", "postgres-backup", "postgres-recovery")
    cluster = find(docs, "Cluster", CLUSTER)
    bootstrap = cluster["spec"]["bootstrap"]
    assert set(bootstrap) == {"recovery"}, "one bootstrap method: recovery replaces initdb"
    recovery = bootstrap["recovery"]
    # the same database, owner and owner's Secret as a fresh one (postgres-roles' initdb)
    fresh = find(render("overlays/production/postgres"), "Cluster", CLUSTER)["spec"]["bootstrap"]["initdb"]
    assert {k: recovery[k] for k in ("database", "owner", "secret")} == {
        k: fresh[k] for k in ("database", "owner", "secret")
    }
    (source,) = [c for c in cluster["spec"]["externalClusters"] if c["name"] == recovery["source"]]
    assert source["plugin"]["name"] == PLUGIN
    backups = source["plugin"]["parameters"]
    assert backups == {"barmanObjectName": "devsched-pg-backups", "serverName": CLUSTER}
    (archiver,) = cluster["spec"]["plugins"]
    assert archiver["isWALArchiver"] is True
    assert archiver["parameters"]["barmanObjectName"] == backups["barmanObjectName"]
    assert archiver["parameters"]["serverName"] != backups["serverName"], "never into the archive it restores"
    # the roles are still managed (their passwords from the namespace's Secrets)
    assert {r["name"] for r in cluster["spec"]["managed"]["roles"]} == {
        "devsched_owner",
        "devsched_scheduler",
        "devsched_sweeper",
    }
    # the services need no change: the Cluster keeps its name, so its Service devsched-pg-rw
    assert cluster["metadata"]["name"] == CLUSTER


def test_the_pooler_carries_the_schedulers_and_sweepers_connections(tmp_path: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = _with(tmp_path, "control-plane", "postgres-pooler")
    pooler = find(docs, "Pooler", "devsched-pg-pooler-rw")
    assert pooler["metadata"]["namespace"] == "devsched"
    assert pooler["spec"]["cluster"] == {"name": CLUSTER}
    assert pooler["spec"]["type"] == "rw"
    # asyncpg's prepared statements and the scheduler's advisory locks need a session of their own
    assert pooler["spec"]["pgbouncer"]["poolMode"] == "session"
    # room for every connection the roles admit (components/postgres-roles)
    roles = find(render("overlays/production/postgres"), "Cluster", CLUSTER)["spec"]["managed"]["roles"]
    limits = {r["name"]: r["connectionLimit"] for r in roles}
    parameters = pooler["spec"]["pgbouncer"]["parameters"]
    assert int(parameters["max_client_conn"]) >= limits["devsched_scheduler"] + limits["devsched_sweeper"]
    assert int(parameters["default_pool_size"]) >= limits["devsched_scheduler"]
    for name in ("devsched-scheduler", "devsched-sweeper"):
        (container,) = containers(pod_spec(find(docs, "Deployment", name)))
        assert _env(container)["DB_HOST"] == pooler["metadata"]["name"], name
    # migrations (DDL, the advisory lock) keep going to Postgres directly
    (job,) = [d for d in docs if d["kind"] == "Job"]
    (container,) = containers(pod_spec(job))
    assert _env(container)["DB_HOST"] == f"{CLUSTER}-rw"
    # and the control plane may reach the pooler's pods, on Postgres' port
    policy = find(docs, "NetworkPolicy", "devsched-control-plane")
    kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)
    assert {
        "to": [{"podSelector": {"matchLabels": {"cnpg.io/poolerName": pooler["metadata"]["name"]}}}],
        "ports": [{"protocol": "TCP", "port": 5432}],
    } in policy["spec"]["egress"]
    # in production the pooler serves TLS with the Cluster's certificate, which names its Service
    certificate = find(render("overlays/production/postgres"), "Certificate", "devsched-pg-server")
    assert "devsched-pg-pooler-rw" in certificate["spec"]["dnsNames"]
    assert "devsched-pg-pooler-rw.devsched.svc" in certificate["spec"]["dnsNames"]


def test_the_components_are_opt_in() -> None:
    for name in ("overlays/dev", "overlays/production", "overlays/production/postgres"):
        docs = render(name)
        assert not {d["kind"] for d in docs} & {"Pooler", "ScheduledBackup", "ObjectStore"}, name
        if name != "overlays/production":  # the Clusters: a fresh database, no archiving
            cluster = find(docs, "Cluster", CLUSTER)
            assert set(cluster["spec"]["bootstrap"]) == {"initdb"}, name
            assert "plugins" not in cluster["spec"], name


def test_the_readmes_drill_restores_beside_production_without_touching_its_archive(tmp_path: Path) -> None:
    """The drill's kustomization, as deploy/README.md gives it, with <repo> filled in."""
    readme = (K8S.parent / "README.md").read_text()
    blocks = re.findall(r"^ *```yaml\n(.*?)^ *```", readme, flags=re.DOTALL | re.MULTILINE)
    (drill,) = [textwrap.dedent(b) for b in blocks if "# drill/kustomization.yaml" in b]
    (tmp_path / "kustomization.yaml").write_text(drill.replace("<repo>", os.path.relpath(K8S.parents[1], tmp_path)))
    docs = _kustomize(tmp_path)
    assert {d["metadata"]["namespace"] for d in docs} == {"devsched-drill"}
    assert "ScheduledBackup" not in {d["kind"] for d in docs}, "a drill takes no backups"
    cluster = find(docs, "Cluster", CLUSTER)
    assert set(cluster["spec"]["bootstrap"]) == {"recovery"}
    (source,) = cluster["spec"]["externalClusters"]
    assert source["plugin"]["parameters"]["serverName"] == CLUSTER, "it restores production's backups"
    (archiver,) = cluster["spec"]["plugins"]
    # its own archive: neither production's nor the one a real restore would take next
    assert archiver["parameters"]["serverName"] == "devsched-pg-drill"
