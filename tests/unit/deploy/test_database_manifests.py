"""Postgres in the manifests: each workload connects as its own role, the clusters manage the roles."""

from __future__ import annotations

from typing import Any

import pytest

from .manifests import (
    OVERLAYS,
    component,
    containers,
    find,
    pod_spec,
    render,
    workloads,
)

pytestmark = pytest.mark.unit


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
        if kind in ("agent", "web"):  # neither ever sees database credentials
            assert not {ref for c in containers(pod_spec(workload)) for ref in _secret_refs(c) if "-pg-" in ref}
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
