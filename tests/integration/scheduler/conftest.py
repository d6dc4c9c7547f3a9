"""Fixtures of the scheduler's integration tests: a scheduler serving in the test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from nats.aio.client import Client as NatsClient

from devsched.scheduler.app import Scheduler

# The harness is shared with tests/e2e/scheduler and tests/chaos, whose conftests put this directory on
# the path too (pytest's rootdir-relative module names do not).
from support.scheduler_harness import TestHost, delete_streams, running_scheduler, scheduler_settings


@pytest.fixture
async def scheduler(database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient) -> AsyncIterator[Scheduler]:
    """A scheduler replica with fast ticks, serving `subject_prefix`; its streams are deleted after."""
    async with running_scheduler(scheduler_settings(database_url, nats_url, subject_prefix)) as running:
        yield running
    await delete_streams(nc, subject_prefix)


@pytest.fixture
async def make_host(nc: NatsClient, subject_prefix: str) -> AsyncIterator[Callable[..., TestHost]]:
    """Make test hosts (closed after the test)."""
    hosts: list[TestHost] = []

    def make(host_id: str | None = None) -> TestHost:
        host = TestHost(nc, subject_prefix, host_id)
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        await host.close()
