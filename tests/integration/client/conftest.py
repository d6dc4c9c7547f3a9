"""Fixtures of the client's tests: the real services as processes, shared by the tests of a module."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from devsched.client import Client
from support.devsched_stack import Stack


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[Client]:
    """A client of the stack's deployment."""
    async with Client.connect(stack.nats_url, prefix=stack.prefix, timeout=5.0) as c:
        yield c
