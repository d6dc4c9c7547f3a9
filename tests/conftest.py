"""Shared fixtures: real NATS and Postgres servers for the session, isolated per test.

Servers are session-scoped and SYNC, so they outlive any event loop; per test, isolation comes from
a fresh database cloned from a migrated template and from a unique NATS subject prefix.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import nats
import pytest
from nats.aio.client import Client as NatsClient

from devsched.embedded import exit_on_sigterm
from support.databases import build_template, create_test_database, drop_database, ensure_test_roles, in_thread
from support.servers import (
    NatsHandle,
    PostgresHandle,
    ServerHandle,
    describe_sources,
    nats_for_tests,
    postgres_for_tests,
)

pytest_plugins = ["support.fixtures"]

_RUNNING: pytest.StashKey[list[ServerHandle]] = pytest.StashKey()


def _register(config: pytest.Config, server: ServerHandle) -> None:
    config.stash.setdefault(_RUNNING, []).append(server)


@pytest.fixture(autouse=True)
def _restart_stopped_servers(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test, start again any session server that the test stopped or killed."""
    yield
    for server in request.config.stash.get(_RUNNING, []):
        if not server.is_running:
            server.start()


@pytest.fixture(scope="session")
def nats_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsHandle]:
    """The session's NATS server (JetStream): `.url`, and `.restart()`/`.kill()`/`.stop()`/`.start()`.

    From `DEVSCHED_TEST_NATS_URL` (fault injection then skips the test), a Docker container, or an
    embedded nats-server. A test that stops or kills it gets it started again after the test.
    """
    with nats_for_tests(tmp_path_factory.mktemp("nats")) as server:
        _register(request.config, server)
        yield server


@pytest.fixture(scope="session")
def postgres_server(request: pytest.FixtureRequest) -> Iterator[PostgresHandle]:
    """The session's Postgres server: `.url(db)`, `.dsn(db)`, and the same fault methods as NATS.

    From `DEVSCHED_TEST_DATABASE_URL`, a Docker container, or an embedded Postgres.
    """
    with postgres_for_tests() as server:
        _register(request.config, server)
        yield server


@pytest.fixture(scope="session")
def database_template(request: pytest.FixtureRequest, postgres_server: PostgresHandle) -> str:
    """Name of the session's template database, with every migration applied (built once).

    The owner, scheduler and sweeper roles are created first (idempotent: sessions share the server's roles);
    the template is owned and migrated by the owner role.
    """
    try:
        from devsched.store.migrations import upgrade  # imported late: tests run before it exists
    except ModuleNotFoundError as exc:
        if exc.name is None or not "devsched.store.migrations".startswith(exc.name):
            raise
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("devsched.store.migrations is missing: the template database is empty")
        return build_template(postgres_server.dsn(), None, postgres_server.url)
    ensure_test_roles(postgres_server.url())
    return build_template(postgres_server.dsn(), lambda url: in_thread(lambda: upgrade(url)), postgres_server.url)


@pytest.fixture
def database_url(postgres_server: PostgresHandle, database_template: str) -> Iterator[str]:
    """A fresh migrated database of its own for this test: `postgresql+asyncpg://...`, dropped after."""
    name = create_test_database(postgres_server.dsn(), database_template)
    yield postgres_server.url(name)
    if not postgres_server.is_running:  # the test stopped it: the drop needs it back
        postgres_server.start()
    drop_database(postgres_server.dsn(), name)


@pytest.fixture
def nats_url(nats_server: NatsHandle) -> str:
    """The NATS server's URL."""
    return nats_server.url


@pytest.fixture
def subject_prefix() -> str:
    """A subject prefix (and stream-name prefix) unique to this test, such as `t1a2b3c4d5e`.

    Tests share one NATS server; prefixing every subject and stream keeps them from seeing each other.
    """
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NatsClient]:
    """A nats-py client connected to `nats_url`, closed after the test.

    It reconnects quickly and forever, so a test that restarts the server keeps using it.
    """

    async def quiet(_: Exception) -> None:
        """Connection errors are expected while a chaos test has the server down."""

    client = await nats.connect(
        nats_url,
        connect_timeout=2,
        reconnect_time_wait=0.1,
        max_reconnect_attempts=-1,
        error_cb=quiet,
    )
    yield client
    await client.close()


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (from `./dev test`'s uv, a CI runner, `kill`) stops the run as Ctrl-C does.

    By default SIGTERM ends Python on the spot: no fixture teardown, no `finally`, no atexit hook, so the
    servers and services of the session would be left to their parent-death signal alone.
    """
    exit_on_sigterm()


def pytest_report_header(config: pytest.Config) -> str:
    """Say where the servers come from, since three sources are possible."""
    return f"devsched test servers: {describe_sources()}"
