"""Per-test Postgres databases cloned from a template that is migrated once per session.

`CREATE DATABASE x TEMPLATE t` copies files: much cheaper than running the migrations per test, and
each test gets a database nobody else touches (procrastinate's conftest does the same).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from collections.abc import Callable
from typing import TypeVar

import asyncpg

T = TypeVar("T")

TEMPLATE = "devsched_template"


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


def build_template(admin_dsn: str, migrate: Callable[[str], None] | None, url_of: Callable[[str], str]) -> str:
    """(Re)create the template database, apply `migrate` to its URL, and return its name.

    The template then refuses connections, so that nothing can hold a session on it while tests
    clone it (CREATE DATABASE ... TEMPLATE fails if anyone is connected).
    """
    drop_database(admin_dsn, TEMPLATE)
    execute(admin_dsn, f"CREATE DATABASE {_quote(TEMPLATE)}")
    if migrate is not None:
        migrate(url_of(TEMPLATE))
    execute(admin_dsn, _terminate(TEMPLATE), f"ALTER DATABASE {_quote(TEMPLATE)} ALLOW_CONNECTIONS false")
    return TEMPLATE


def create_test_database(admin_dsn: str, template: str) -> str:
    """Clone `template` into a new database with a unique name, and return the name."""
    name = f"test_{uuid.uuid4().hex}"
    execute(admin_dsn, f"CREATE DATABASE {_quote(name)} TEMPLATE {_quote(template)}")
    return name
