"""Fixtures of the chaos tests: control-plane processes of the test's own, killed or stopped at will."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from support.scheduler_harness import (
    ServiceProcess,
    Spawn,
    delete_streams,
    scheduler_process,
    service_env,
    sweeper_process,
)


@pytest.fixture
async def spawn(
    database_url: str, nats_url: str, subject_prefix: str, tmp_path: Path, nc: NatsClient
) -> AsyncIterator[Spawn]:
    """Start scheduler/sweeper processes for this test's database and prefix; all killed after it."""
    started: list[ServiceProcess] = []

    def start(kind: str, **overrides: Any) -> ServiceProcess:
        env = service_env(database_url, nats_url, subject_prefix, **overrides)
        make = scheduler_process if kind == "scheduler" else sweeper_process
        proc = make(env, tmp_path / f"{kind}-{len(started)}.log").start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
    await delete_streams(nc, subject_prefix)
