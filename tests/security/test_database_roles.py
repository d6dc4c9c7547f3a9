"""Least privilege in Postgres: each service connects as its own role, which can do only its own DML.

Each claim of devsched.store.roles is attacked here against the real Postgres: the sweeper's role
trying to submit or rewrite a task, the scheduler's role trying to change the schema, a role with no
grant trying to get in through PUBLIC; and each service is shown to work as its own role, in process
(every sweep outcome) and as real processes (a task to `done`, an expired lease ended by the sweeper).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from devsched.core.status import TaskStatus
from devsched.store import ManualClock, Store
from devsched.store.health import expected_revision
from devsched.store.migrations import downgrade, upgrade
from devsched.store.roles import (
    GRANTS,
    OWNER_ROLE_SETTINGS,
    SERVICE_ROLE_SETTINGS,
    UNGRANTED_TABLES,
    DatabaseRoles,
    adopt_schema_sql,
    ensure_roles_at,
    quote_ident,
    role_url,
)
from support.databases import ROLES, TEST_PASSWORD, in_thread, owner_url, service_url
from support.devsched_stack import Stack, run_devsched, up_process
from support.polling import eventually
from support.servers import PostgresHandle
from support.store_lab import Lab

pytestmark = [pytest.mark.security, pytest.mark.integration]

TASK_INSERT = (
    "INSERT INTO tasks (task_id, status, priority, max_attempts, lease_ttl_s, plan, created_at, updated_at)"
    " VALUES (gen_random_uuid(), 'queued', 0, 1, 30, '{\"steps\": []}', now(), now())"
)


def plain(url: str) -> str:
    """A `postgresql+asyncpg://` URL as an asyncpg DSN."""
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def connect_as(database_url: str, role: str) -> asyncpg.Connection:
    """A bare session as `role` (no server settings of our engine: what a psql user would get)."""
    url = owner_url(database_url) if role == "owner" else service_url(database_url, role)
    return await asyncpg.connect(plain(url), timeout=10)


@pytest.fixture
async def admin(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A superuser session on the test's database, to look at what the roles did."""
    conn = await asyncpg.connect(plain(database_url), timeout=10)
    yield conn
    await conn.close()


def migrate_as_owner(database_url: str) -> None:
    in_thread(lambda: upgrade(owner_url(database_url)))


async def privileges(admin: asyncpg.Connection) -> dict[str, Any]:
    """Every privilege the service roles and PUBLIC hold in this database, as comparable data."""
    roles = [ROLES.scheduler, ROLES.sweeper]
    tables = await admin.fetch(
        "SELECT grantee, table_name, privilege_type FROM information_schema.role_table_grants"
        " WHERE grantee = ANY($1::text[]) ORDER BY 1, 2, 3",
        roles,
    )
    columns = await admin.fetch(
        "SELECT grantee, table_name, column_name, privilege_type FROM information_schema.column_privileges"
        " WHERE grantee = ANY($1::text[]) ORDER BY 1, 2, 3, 4",
        roles,
    )
    sequences = await admin.fetch(
        "SELECT c.relname, a.grantee::regrole::text AS grantee, a.privilege_type"
        " FROM pg_class c, aclexplode(c.relacl) a WHERE c.relkind = 'S' ORDER BY 1, 2, 3"
    )
    database = await admin.fetchval("SELECT datacl::text FROM pg_database WHERE datname = current_database()")
    schema = await admin.fetchval("SELECT nspacl::text FROM pg_namespace WHERE nspname = 'public'")
    return {
        "tables": [tuple(r) for r in tables],
        "columns": [tuple(r) for r in columns],
        "sequences": [tuple(r) for r in sequences],
        "database": database,
        "schema": schema,
    }


# -- the sweeper's role --------------------------------------------------------------------------------


async def test_the_sweepers_role_cannot_insert_a_task(database_url: str, admin: asyncpg.Connection) -> None:
    sweeper = await connect_as(database_url, "sweeper")
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied for table tasks"):
            await sweeper.execute(TASK_INSERT)
    finally:
        await sweeper.close()
    assert await admin.fetchval("SELECT count(*) FROM tasks") == 0


async def test_the_sweepers_role_cannot_rewrite_a_plan_delete_or_touch_hosts(
    database_url: str, admin: asyncpg.Connection
) -> None:
    await admin.execute(TASK_INSERT)
    before = await admin.fetchrow("SELECT task_id, plan, priority FROM tasks")
    sweeper = await connect_as(database_url, "sweeper")
    try:
        for statement in (
            # a new plan would run on a host: only the columns a sweep writes are granted
            'UPDATE tasks SET plan = \'{"steps": [{"name": "x", "action": "shell"}]}\'',
            "UPDATE tasks SET priority = 1000",
            # releases are the scheduler's to count (a sweep never releases): not a sweeper's to forge
            "UPDATE tasks SET releases = 1",
            "DELETE FROM tasks",
            "DELETE FROM outbox",
            "SELECT * FROM outbox",
            "SELECT * FROM hosts",
            "INSERT INTO cancel_requests VALUES (gen_random_uuid(), 1, now(), 'x')",
            "UPDATE outbox SET headers = '{}'",
            "INSERT INTO outbox_sent (ids, top, floor, at) VALUES ('{}', '1', '1', now())",
            "TRUNCATE tasks CASCADE",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await sweeper.execute(statement)
    finally:
        await sweeper.close()
    assert await admin.fetchrow("SELECT task_id, plan, priority FROM tasks") == before


async def test_the_sweeper_prunes_only_through_the_prune_function_and_only_ended_old_tasks(
    database_url: str, admin: asyncpg.Connection
) -> None:
    """The sweeper has no DELETE; `devsched_prune` removes ended old tasks and refuses a short retention."""
    await admin.execute(TASK_INSERT)  # queued, and as old as can be: never pruned
    await admin.execute(TASK_INSERT.replace("'queued'", "'done'"))
    await admin.execute(
        "UPDATE tasks SET created_at = now() - interval '400 days', updated_at = now() - interval '400 days'"
    )
    sweeper = await connect_as(database_url, "sweeper")
    try:
        with pytest.raises(asyncpg.InvalidParameterValueError, match="shorter than the least allowed"):
            await sweeper.fetchval("SELECT devsched_prune(interval '59 minutes', 100)")
        with pytest.raises(asyncpg.InvalidParameterValueError, match=re.escape("outside 1..10000")):
            await sweeper.fetchval("SELECT devsched_prune(interval '1 day', 1000000)")
        assert await sweeper.fetchval("SELECT devsched_prune(interval '1 day', 100)") == 1
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # its own function's body, not a table's rights
            await sweeper.execute("DELETE FROM tasks")
    finally:
        await sweeper.close()
    assert [r["status"] for r in await admin.fetch("SELECT status FROM tasks")] == ["queued"]


async def test_no_role_but_the_sweeper_may_prune(database_url: str, admin: asyncpg.Connection) -> None:
    await admin.execute(TASK_INSERT.replace("'queued'", "'done'"))
    await admin.execute(
        "UPDATE tasks SET created_at = now() - interval '400 days', updated_at = now() - interval '400 days'"
    )
    scheduler = await connect_as(database_url, "scheduler")
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied for function devsched_prune"):
            await scheduler.fetchval("SELECT devsched_prune(interval '1 day', 100)")
    finally:
        await scheduler.close()
    public = await admin.fetchval(
        "SELECT has_function_privilege('public', 'devsched_prune(interval, integer)', 'EXECUTE')"
    )
    assert public is False
    assert await admin.fetchval("SELECT count(*) FROM tasks") == 1


# -- the scheduler's role ------------------------------------------------------------------------------


async def test_the_schedulers_role_cannot_alter_the_schema(database_url: str, admin: asyncpg.Connection) -> None:
    migrate_as_owner(database_url)  # a clone keeps PUBLIC's database privileges until migrated (TEMP)
    schema_before = await admin.fetch(
        "SELECT table_name, column_name, data_type FROM information_schema.columns"
        " WHERE table_schema = 'public' ORDER BY 1, 2"
    )
    scheduler = await connect_as(database_url, "scheduler")
    try:
        for statement in (
            "CREATE TABLE public.evil (x int)",
            "CREATE TABLE evil (x int)",
            "CREATE TEMPORARY TABLE evil (x int)",
            "CREATE SCHEMA evil",
            "ALTER TABLE tasks ADD COLUMN evil text",
            "ALTER TABLE attempts DROP CONSTRAINT ck_attempts_ended",
            "DROP TABLE outbox",
            "DROP INDEX uq_attempts_one_active_per_device",
            "CREATE INDEX evil ON tasks (name)",
            "TRUNCATE outbox",
            "UPDATE outbox SET data = '{}'",  # a recorded event is never rewritten (its publication is apart)
            "UPDATE outbox_sent SET ids = '{}'",  # nor is a record of its publication
            "DELETE FROM outbox_sent",
            "DELETE FROM tasks",
            "CREATE FUNCTION evil() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            "ALTER ROLE devsched_sweeper SET statement_timeout = 0",
            "UPDATE alembic_version SET version_num = '0001'",
        ):
            with pytest.raises((asyncpg.InsufficientPrivilegeError, asyncpg.UndefinedObjectError)):
                await scheduler.execute(statement)
        # a claim locks rows through the view (UPDATE is granted on it for that), which writes through to nothing
        with pytest.raises(asyncpg.ObjectNotInPrerequisiteStateError, match="cannot update view"):
            await scheduler.execute("UPDATE outbox_unsent SET data = '{}'")
        await scheduler.execute("SELECT id FROM outbox_unsent ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED")
    finally:
        await scheduler.close()
    after = await admin.fetch(
        "SELECT table_name, column_name, data_type FROM information_schema.columns"
        " WHERE table_schema = 'public' ORDER BY 1, 2"
    )
    assert after == schema_before
    scheduler = await connect_as(database_url, "scheduler")
    try:  # without grant options Postgres only warns; what matters is that nothing was granted
        await scheduler.execute(f"GRANT INSERT ON tasks TO PUBLIC, {ROLES.sweeper}")
    finally:
        await scheduler.close()
    assert not await admin.fetch(
        "SELECT 1 FROM information_schema.role_table_grants WHERE table_name = 'tasks'"
        " AND privilege_type = 'INSERT' AND grantee IN ('PUBLIC', $1)",
        ROLES.sweeper,
    )
    assert await admin.fetchval("SELECT version_num FROM alembic_version") == expected_revision()


async def test_as_the_schedulers_role_an_older_releases_reservation_is_taken_and_the_view_is_read_only(
    database_url: str, admin: asyncpg.Connection
) -> None:
    """Migration 0015: during a rolling update an older scheduler still writes a reservation with each attempt."""
    migrate_as_owner(database_url)
    await admin.execute(
        "INSERT INTO hosts (host_id, heartbeat_interval_s, registered_at, last_seen_at) VALUES ('h1', 5, now(), now());"
        " INSERT INTO devices (device_id, host_id, updated_at) VALUES ('d1', 'h1', now())"
    )
    task = await admin.fetchval(TASK_INSERT + " RETURNING task_id")
    older = (
        "WITH a AS (INSERT INTO attempts (task_id, attempt, lease_id, host_id, device_id, status, assigned_at,"
        " expires_at) VALUES ($1, 1, gen_random_uuid(), 'h1', 'd1', 'active', now(), now()) RETURNING 1)"
        " INSERT INTO reservations (task_id, attempt, device_id, attempt_status, created_at)"
        " VALUES ($1, 1, 'd1', 'active', now())"
    )
    scheduler = await connect_as(database_url, "scheduler")
    try:
        await scheduler.execute(older, task)
        for statement in ("UPDATE reservations SET attempt_status = 'done'", "DELETE FROM reservations"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied for view reservations"):
                await scheduler.execute(statement)
    finally:
        await scheduler.close()
    for statement in ("UPDATE reservations SET attempt_status = 'done'", "DELETE FROM reservations"):
        with pytest.raises(asyncpg.FeatureNotSupportedError, match="a reservation is its attempt"):
            await admin.execute(statement)  # not even the owner writes through the view
    rows = await admin.fetch("SELECT task_id, device_id, attempt_status FROM reservations")
    assert [tuple(r) for r in rows] == [(task, "d1", "active")]
    assert await admin.fetchval("SELECT count(*) FROM attempts") == 1


async def test_the_owner_owns_every_object_and_the_services_own_none(admin: asyncpg.Connection) -> None:
    owners = await admin.fetch(
        "SELECT c.relname, pg_get_userbyid(c.relowner) AS owner FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'"
    )
    assert owners
    assert {r["owner"] for r in owners} == {ROLES.owner}
    database_owner = "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()"
    assert await admin.fetchval(database_owner) == ROLES.owner
    flags = await admin.fetch(
        "SELECT rolname, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls, rolreplication FROM pg_roles"
        " WHERE rolname = ANY($1::text[])",
        [ROLES.owner, ROLES.scheduler, ROLES.sweeper],
    )
    assert len(flags) == 3
    assert all(not any(tuple(r)[1:]) for r in flags), flags


# -- PUBLIC ----------------------------------------------------------------------------------------------


async def test_a_role_without_grants_cannot_connect_or_create(
    postgres_server: PostgresHandle, database_url: str, admin: asyncpg.Connection
) -> None:
    migrate_as_owner(database_url)
    stranger = f"stranger_{uuid.uuid4().hex[:8]}"
    await admin.execute(f"CREATE ROLE {stranger} LOGIN PASSWORD '{TEST_PASSWORD}'")
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied for database"):
            await asyncpg.connect(plain(role_url(database_url, stranger, TEST_PASSWORD)), timeout=10)
        # what PUBLIC still has: nothing on the database, nothing on schema public
        acl = await admin.fetchval("SELECT datacl::text FROM pg_database WHERE datname = current_database()")
        assert acl is not None
        assert not any(entry.startswith("=") for entry in acl.strip("{}").split(","))
        schema = await admin.fetchval("SELECT nspacl::text FROM pg_namespace WHERE nspname = 'public'")
        assert schema is not None
        assert not any(entry.startswith("=") for entry in schema.strip("{}").split(","))
    finally:
        await admin.execute(f"DROP ROLE {stranger}")


# -- timeouts on the roles -----------------------------------------------------------------------------


async def test_the_timeouts_are_set_on_the_roles(database_url: str, admin: asyncpg.Connection) -> None:
    rows = await admin.fetch(
        "SELECT r.rolname, s.setconfig FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole"
        " WHERE s.setdatabase = 0 AND r.rolname = ANY($1::text[])",
        [ROLES.owner, ROLES.scheduler, ROLES.sweeper],
    )
    settings = {r["rolname"]: dict(item.split("=", 1) for item in r["setconfig"]) for r in rows}
    assert settings[ROLES.scheduler] == dict(SERVICE_ROLE_SETTINGS)
    assert settings[ROLES.sweeper] == dict(SERVICE_ROLE_SETTINGS)
    assert settings[ROLES.owner] == dict(OWNER_ROLE_SETTINGS)
    for role in ("scheduler", "sweeper"):
        conn = await connect_as(database_url, role)  # a bare session: none of the engine's server_settings
        try:
            assert await conn.fetchval("SHOW statement_timeout") == "10s"
            assert await conn.fetchval("SHOW lock_timeout") == "5s"
            assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "30s"
        finally:
            await conn.close()
    owner = await connect_as(database_url, "owner")
    try:
        assert await owner.fetchval("SHOW statement_timeout") == "0"  # migrations may take long
        assert await owner.fetchval("SHOW lock_timeout") == "30s"
    finally:
        await owner.close()


# -- migrate keeps the grants --------------------------------------------------------------------------


async def test_rerunning_migrate_is_idempotent_and_converges(database_url: str, admin: asyncpg.Connection) -> None:
    migrate_as_owner(database_url)
    first = await privileges(admin)
    migrate_as_owner(database_url)
    assert await privileges(admin) == first

    # drift either way is repaired by the next run: an extra privilege goes, a lost one comes back
    await admin.execute(f"GRANT DELETE ON tasks TO {ROLES.sweeper}")
    await admin.execute(f"REVOKE INSERT ON tasks FROM {ROLES.scheduler}")
    await admin.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
    assert await privileges(admin) != first
    migrate_as_owner(database_url)
    assert await privileges(admin) == first

    table_grants = {(g, t, p) for g, t, p in first["tables"]}
    assert (ROLES.scheduler, "tasks", "INSERT") in table_grants
    assert not any(p in ("DELETE", "TRUNCATE", "REFERENCES", "TRIGGER") for _, _, p in table_grants)
    assert not any(g == ROLES.sweeper and p == "INSERT" and t != "outbox" for g, t, p in table_grants)
    assert (ROLES.sweeper, "tasks", "plan", "UPDATE") not in set(first["columns"])
    assert (ROLES.sweeper, "tasks", "status", "UPDATE") in set(first["columns"])


async def test_concurrent_migration_runs_take_turns_and_all_succeed(
    database_url: str, admin: asyncpg.Connection
) -> None:
    """Two releases' Jobs, or a retried Job beside its first pod: each run finds the schema where the last left it."""
    migrate_as_owner(database_url)
    granted = await privileges(admin)
    await asyncio.to_thread(downgrade, owner_url(database_url), "base")
    # Separate processes, as two Jobs are (alembic's context is process-global: threads cannot show it).
    # Each starts at the same wall-clock instant, once its imports are done.
    script = (
        "import sys, time; from devsched.store.migrations import upgrade;"
        " time.sleep(max(0.0, float(sys.argv[2]) - time.time())); upgrade(sys.argv[1])"
    )
    start_at = str(time.time() + 4)
    runs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, owner_url(database_url), start_at, stderr=asyncio.subprocess.PIPE
        )
        for _ in range(3)
    ]
    outcomes = await asyncio.wait_for(asyncio.gather(*(r.communicate() for r in runs)), 120)
    failures = [err.decode()[-2000:] for run, (_, err) in zip(runs, outcomes, strict=True) if run.returncode != 0]
    assert not failures, failures
    assert await admin.fetchval("SELECT version_num FROM alembic_version") == expected_revision()
    assert await privileges(admin) == granted


async def test_the_service_roles_read_the_schema_version_and_cannot_change_it(
    database_url: str, admin: asyncpg.Connection
) -> None:
    """Their readiness compares `alembic_version` with the release's migrations: read it, nothing more."""
    migrate_as_owner(database_url)
    for role in ("scheduler", "sweeper"):
        conn = await connect_as(database_url, role)
        try:
            assert await conn.fetchval("SELECT version_num FROM alembic_version") == expected_revision()
            for statement in (
                "UPDATE alembic_version SET version_num = '0001'",
                "DELETE FROM alembic_version",
                "INSERT INTO alembic_version VALUES ('9999')",
                "TRUNCATE alembic_version",
            ):
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await conn.execute(statement)
        finally:
            await conn.close()
    assert await admin.fetchval("SELECT version_num FROM alembic_version") == expected_revision()


async def test_every_table_has_its_grants(admin: asyncpg.Connection) -> None:
    """A table (or view: `reservations`, migration 0015) a migration adds must be listed in GRANTS."""
    tables = {
        r[0]
        for r in await admin.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            " UNION SELECT viewname FROM pg_views WHERE schemaname = 'public' AND viewname NOT LIKE 'pg\\_%'"
        )
    }
    listed = {t for grants in GRANTS.values() for t in grants}
    assert tables - UNGRANTED_TABLES == listed


def test_creating_the_roles_is_idempotent_and_race_free(postgres_server: PostgresHandle) -> None:
    tag = uuid.uuid4().hex[:8]
    roles = DatabaseRoles(owner=f"o_{tag}", scheduler=f"sc_{tag}", sweeper=f"sw_{tag}")
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def create() -> None:
        try:
            start.wait(10)
            ensure_roles_at(postgres_server.url(), roles, {roles.owner: "a:b'c%s$$"})  # quoted, never bound
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert not errors, errors
        ensure_roles_at(postgres_server.url(), roles)  # and once more, when they all exist
    finally:

        async def drop() -> None:
            conn = await asyncpg.connect(postgres_server.dsn(), timeout=10)
            try:
                for name in (roles.owner, roles.scheduler, roles.sweeper):
                    await conn.execute(f"DROP ROLE IF EXISTS {quote_ident(name)}")
            finally:
                await conn.close()

        in_thread(lambda: asyncio.run(drop()))


async def test_a_downgrade_gives_back_the_privileges_and_the_next_upgrade_takes_them_again(
    database_url: str, admin: asyncpg.Connection
) -> None:
    migrate_as_owner(database_url)
    granted = await privileges(admin)
    await asyncio.to_thread(downgrade, owner_url(database_url), "0002")
    assert await admin.fetchval("SELECT version_num FROM alembic_version") == "0002"
    after = await privileges(admin)
    assert after["tables"] == []
    assert after["columns"] == []
    assert "=Tc/" in after["database"]  # PUBLIC may connect again, as before 0003
    migrate_as_owner(database_url)
    assert await privileges(admin) == granted


def test_role_names_are_checked() -> None:
    assert DatabaseRoles.from_env({"DEVSCHED_DB_SWEEPER_ROLE": "lab_sweeper"}).sweeper == "lab_sweeper"
    for bad in ("a b", "x;drop", 'a"b', "pg_signal", "", "a" * 64):
        with pytest.raises(ValueError, match="database role name"):
            DatabaseRoles(sweeper=bad)
    with pytest.raises(ValueError, match="DEVSCHED_DB_SWEEPER_ROLE='x;drop'"):
        DatabaseRoles.from_env({"DEVSCHED_DB_SWEEPER_ROLE": "x;drop"})
    with pytest.raises(ValueError, match="three different roles"):
        DatabaseRoles(scheduler="same", sweeper="same")


# -- each service works as its own role ----------------------------------------------------------------


async def test_every_sweep_outcome_works_as_the_sweepers_role(database_url: str) -> None:
    """Requeue, fail at the attempt limit, and cancel: the scheduler's and sweeper's own roles, one clock."""
    clock = ManualClock()
    scheduler = Store.connect(service_url(database_url, "scheduler"), clock=clock)
    sweeper = Store.connect(service_url(database_url, "sweeper"), clock=clock)
    lab = Lab(scheduler, clock)
    try:
        await lab.host("h1", "h1-d1", "h1-d2")
        requeued = await lab.running(max_attempts=2, lease_ttl_s=30)
        failed = await lab.running(max_attempts=1, lease_ttl_s=30)
        clock.advance(31)
        await lab.alive()
        assert {e.task_id for e in await sweeper.sweep_expired()} == {requeued.task_id, failed.task_id}
        assert (await scheduler.get_task(requeued.task_id)).status == TaskStatus.QUEUED
        assert (await scheduler.get_task(failed.task_id)).status == TaskStatus.FAILED

        clock.advance(31)  # past the devices' grace
        await lab.alive()
        cancelled = await lab.running(max_attempts=3, lease_ttl_s=30)
        await scheduler.request_cancel(cancelled.task_id, "enough")
        clock.advance(31)
        await lab.alive()
        await sweeper.sweep_expired()
        assert (await scheduler.get_task(cancelled.task_id)).status == TaskStatus.CANCELLED
        assert await scheduler.unsent_count() > 0  # the sweeper's events went to the outbox
    finally:
        await scheduler.close()
        await sweeper.close()


async def sessions_of(stack: Stack) -> set[tuple[str, str]]:
    conn = await asyncpg.connect(plain(stack.database_url), timeout=10)
    try:
        rows = await conn.fetch(
            "SELECT DISTINCT usename, application_name FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    finally:
        await conn.close()
    return {(r["usename"], r["application_name"]) for r in rows}


async def test_the_stack_runs_a_task_to_done_with_each_service_as_its_own_role(stack: Stack, tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("steps:\n  - {name: hello, action: shell, args: {command: echo hi}}\n")
    result = await asyncio.to_thread(
        run_devsched, "submit", str(plan), "--selector", "platform=sim", "--wait", "--json",
        env=stack.cli_env(), timeout=90,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr + stack.logs()
    users = {user for user, _ in await sessions_of(stack)}
    # every session on the stack's database is one of the two service roles, never a superuser
    assert users == {ROLES.scheduler, ROLES.sweeper}, users


async def test_the_sweeper_process_ends_an_expired_lease_as_its_role(stack: Stack, tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("steps:\n  - {name: soak, action: sleep, args: {seconds: 30}, interruptible: true}\n")
    submitted = await asyncio.to_thread(
        run_devsched, "submit", str(plan), "--selector", "platform=sim", "--lease-ttl", "2",
        "--max-attempts", "1", "--json", env=stack.cli_env(),
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    task_id = json.loads(submitted.stdout)["task_id"]

    def status() -> str:
        got = run_devsched("get", task_id, "--json", env=stack.cli_env())
        return str(json.loads(got.stdout)["status"]) if got.returncode == 0 else "?"

    await eventually(lambda: status() == "dispatched", timeout=30, interval=0.2, message="dispatched")
    agent = next(p for p in stack.procs if p.name == "agent")
    with agent.paused():  # the host goes silent: only the sweeper can end the lease
        await eventually(lambda: status() == "failed", timeout=30, interval=0.3, message="failed by the sweeper")
    view = json.loads(run_devsched("get", task_id, "--json", env=stack.cli_env()).stdout)
    assert view["reason"] == "lease_expired"
    assert view["attempts"][0]["status"] == "expired"


# -- devsched up and databases from before the roles ------------------------------------------------------


async def test_a_database_from_before_the_roles_is_adopted_by_the_owner(
    postgres_server: PostgresHandle, database_template: str
) -> None:
    """What `devsched up` does to a data directory of an older version: tables owned by `postgres`."""
    name = f"old_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(postgres_server.dsn(), timeout=10)
    try:
        await admin.execute(f"CREATE DATABASE {name}")  # owned by the superuser, as before
        url = postgres_server.url(name)
        await asyncio.to_thread(upgrade, url, "0002")  # the schema as it was, migrated as `postgres`
        conn = await asyncpg.connect(postgres_server.dsn(name), timeout=10)
        try:
            for statement in adopt_schema_sql(ROLES):
                await conn.execute(statement)
            owners = {r[0] for r in await conn.fetch("SELECT tableowner FROM pg_tables WHERE schemaname = 'public'")}
            assert owners == {ROLES.owner}
        finally:
            await conn.close()
        await asyncio.to_thread(upgrade, owner_url(url))  # 0003 as the owner: it may grant on its tables now
        sweeper = await asyncpg.connect(plain(service_url(url, "sweeper")), timeout=10)
        try:
            assert await sweeper.fetchval("SELECT count(*) FROM tasks") == 0
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await sweeper.execute(TASK_INSERT)
        finally:
            await sweeper.close()
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()


@pytest.mark.e2e
async def test_devsched_up_runs_each_service_as_its_own_role(tmp_path: Path) -> None:
    out_path = tmp_path / "up.out"
    argv = [sys.executable, "-m", "devsched.client", "up", "--no-demo", "--no-live", "--hosts", "1",
            "--devices-per-host", "1", "--nats-port", "0", "--web-port", "0"]  # fmt: skip
    up = up_process(argv, tmp_path, out_path)
    try:
        await eventually(lambda: not up.running or "devsched is up." in out_path.read_text(), timeout=90, interval=0.2)
        assert up.running, out_path.read_text()
        env_file = (tmp_path / ".devsched" / "env").read_text()
        (url,) = re.findall(r"DEVSCHED_DATABASE_URL=(\S+)", env_file)
        assert f"//{ROLES.owner}@" in url, env_file  # migrate, and the user's `devsched migrate`, as the owner
        admin = await asyncpg.connect(plain(role_url(url, "postgres")), timeout=10)
        try:

            async def users() -> set[str]:
                rows = await admin.fetch(
                    "SELECT usename FROM pg_stat_activity WHERE datname = 'devsched' AND pid <> pg_backend_pid()"
                    " AND backend_type = 'client backend'"
                )
                return {r[0] for r in rows}

            async def both() -> bool:
                return {ROLES.scheduler, ROLES.sweeper} <= await users()

            await eventually(both, timeout=30, message="both services connected")
            assert await users() == {ROLES.scheduler, ROLES.sweeper}
            owner = await admin.fetchval("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'devsched'")
            assert owner == ROLES.owner
        finally:
            await admin.close()
        assert await asyncio.to_thread(up.stop, 60) == 0, out_path.read_text()  # SIGTERM, SIGKILL after 60 s
    finally:
        up.kill()
