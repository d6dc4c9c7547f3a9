"""Fixtures shared by several test folders (registered in tests/conftest.py as a pytest plugin)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from nats.aio.client import Client as NatsClient

from support.agent_e2e import Plane
from support.databases import create_test_database, drop_database, in_thread
from support.devsched_stack import Stack, stack_for_tests
from support.scheduler_harness import TestHost, delete_streams_at
from support.servers import NatsHandle, PostgresHandle


@pytest.fixture
async def make_host(nc: NatsClient, subject_prefix: str) -> AsyncIterator[Callable[..., TestHost]]:
    """Make protocol-speaking test hosts on the test's prefix (closed after the test)."""
    hosts: list[TestHost] = []

    def make(host_id: str | None = None) -> TestHost:
        host = TestHost(nc, subject_prefix, host_id)
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        await host.close()


@pytest.fixture(scope="module")
def stack(
    nats_server: NatsHandle,
    postgres_server: PostgresHandle,
    database_template: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    """Scheduler, sweeper and an agent with two `platform=sim` devices, on a database and prefix of their own."""
    with stack_for_tests(nats_server, postgres_server, database_template, tmp_path_factory.mktemp("stack")) as s:
        yield s


@pytest.fixture(scope="module")
def agent_plane(
    nats_server: NatsHandle,
    postgres_server: PostgresHandle,
    database_template: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Plane]:
    """A scheduler and a sweeper (processes) shared by a module's real-agent tests, each test with its own
    hosts, devices and label; on a database and prefix of their own."""
    name = create_test_database(postgres_server.dsn(), database_template)
    prefix = f"a{uuid.uuid4().hex[:10]}"
    plane = Plane.start(postgres_server.url(name), nats_server.url, prefix, tmp_path_factory.mktemp("plane"))
    try:
        in_thread(lambda: asyncio.run(plane.ready()))
        yield plane
    finally:
        plane.stop()
        in_thread(lambda: asyncio.run(delete_streams_at(nats_server.url, prefix)))
        drop_database(postgres_server.dsn(), name)
