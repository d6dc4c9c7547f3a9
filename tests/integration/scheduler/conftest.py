"""Fixtures of the scheduler's integration tests: a scheduler serving in the test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client as NatsClient

from devsched.scheduler.app import Scheduler

# The harness is shared with tests/e2e/scheduler and tests/chaos, whose conftests put this directory on
# the path too (pytest's rootdir-relative module names do not).
from support.scheduler_harness import delete_streams, running_scheduler, scheduler_settings


@pytest.fixture
async def scheduler(database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient) -> AsyncIterator[Scheduler]:
    """A scheduler replica with fast ticks, serving `subject_prefix`; its streams are deleted after."""
    async with running_scheduler(scheduler_settings(database_url, nats_url, subject_prefix)) as running:
        yield running
    await delete_streams(nc, subject_prefix)
