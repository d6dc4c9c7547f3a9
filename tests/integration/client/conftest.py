"""Fixtures of the client's tests: the real services as processes, shared by the tests of a module."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from devsched.client import Client

# The stack helper is shared with tests/e2e/cli, whose conftest puts this directory on the path too.
from support.devsched_stack import Stack, stack_for_tests
from support.servers import NatsHandle, PostgresHandle


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


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[Client]:
    """A client of the stack's deployment."""
    async with Client.connect(stack.nats_url, prefix=stack.prefix, timeout=5.0) as c:
        yield c
