"""Per-test Postgres databases cloned from a template that is migrated once per session.

`CREATE DATABASE x TEMPLATE t` copies files: much cheaper than running the migrations per test, and
each test gets a database nobody else touches (procrastinate's conftest does the same).

The databases are owned by the owner role and migrated as it, like in production; the services started
by the harness connect as their own roles (`service_url`). The roles are cluster-wide, so every test
session on one server shares them; `ensure_test_roles` creates them idempotently and race-free.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from collections.abc import Callable, Mapping
from typing import TypeVar

import asyncpg

from devsched.store.roles import DatabaseRoles, ensure_roles_at, role_url

T = TypeVar("T")

TEMPLATE = "devsched_template"

#: The role names of the tests: the defaults (tests must see what a user gets).
ROLES = DatabaseRoles()
#: One password for every test role: ignored by the `trust` servers the harness starts itself, needed on
#: a server given by DEVSCHED_TEST_DATABASE_URL that checks passwords.
TEST_PASSWORD = "devsched-test-only"


def in_thread(fn: Callable[[], T]) -> T:
    """Run `fn` in a fresh thread and return its result.

    Sync fixtures use this for anything that runs its own event loop (asyncpg through
    `asyncio.run`, alembic's async env): calling `asyncio.run` on the test thread would replace the
    event loop that pytest-asyncio set for the test.
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn).result()


def execute(dsn: str, *statements: str) -> None:
    """Run each statement on its own (CREATE/DROP DATABASE refuse to run in a transaction)."""

    async def run() -> None:
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    in_thread(lambda: asyncio.run(run()))


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _terminate(name: str) -> str:
    # Sessions left over (a pool not disposed by a test) would block CREATE ... TEMPLATE and DROP.
    literal = name.replace("'", "''")
    return (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        f" WHERE datname = '{literal}' AND pid <> pg_backend_pid()"
    )


def drop_database(admin_dsn: str, name: str) -> None:
    """Drop `name` if it exists, ending its sessions first."""
    execute(admin_dsn, _terminate(name), f"DROP DATABASE IF EXISTS {_quote(name)} WITH (FORCE)")


def ensure_test_roles(admin_url: str) -> None:
    """Create (or update) the owner, scheduler and sweeper roles on the server of `admin_url` (a superuser)."""
    passwords = dict.fromkeys((ROLES.owner, ROLES.scheduler, ROLES.sweeper), TEST_PASSWORD)
    in_thread(lambda: ensure_roles_at(admin_url, ROLES, passwords))


def owner_url(url: str) -> str:
    """`url` (any role's URL of a test database) as the owner role: what migrations run as."""
    return role_url(url, ROLES.owner, TEST_PASSWORD)


def service_url(url: str, service: str) -> str:
    """`url` as the role of `service` (`scheduler` or `sweeper`): what that service connects with."""
    return role_url(url, ROLES.service(service), TEST_PASSWORD)


def as_service_role(env: Mapping[str, str], service: str) -> dict[str, str]:
    """`env` with its `DEVSCHED_DATABASE_URL` (if any) turned into the URL of `service`'s own database role."""
    out = dict(env)
    if url := out.get("DEVSCHED_DATABASE_URL"):
        out["DEVSCHED_DATABASE_URL"] = service_url(url, service)
    return out


def build_template(admin_dsn: str, migrate: Callable[[str], None] | None, url_of: Callable[[str], str]) -> str:
    """(Re)create the template database, apply `migrate` to its URL as the owner role, and return its name.

    The template then refuses connections, so that nothing can hold a session on it while tests
    clone it (CREATE DATABASE ... TEMPLATE fails if anyone is connected). The roles must exist
    (`ensure_test_roles`).
    """
    drop_database(admin_dsn, TEMPLATE)
    execute(admin_dsn, f"CREATE DATABASE {_quote(TEMPLATE)} OWNER {_quote(ROLES.owner)}")
    if migrate is not None:
        migrate(owner_url(url_of(TEMPLATE)))
    execute(admin_dsn, _terminate(TEMPLATE), f"ALTER DATABASE {_quote(TEMPLATE)} ALLOW_CONNECTIONS false")
    return TEMPLATE


def create_test_database(admin_dsn: str, template: str) -> str:
    """Clone `template` into a new database with a unique name, owned by the owner role; return the name.

    A clone copies the tables and their grants, not the database's own ACL: PUBLIC may connect to it.
    Running the migrations again (as the owner) takes that away, as on a real deployment.
    """
    name = f"test_{uuid.uuid4().hex}"
    execute(admin_dsn, f"CREATE DATABASE {_quote(name)} TEMPLATE {_quote(template)} OWNER {_quote(ROLES.owner)}")
    return name
