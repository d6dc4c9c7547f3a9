"""Fixtures of the agent's integration tests: a stand-in scheduler and agents serving in the test's loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from devsched.agent.config import AgentConfig, parse_config
from devsched.protocol.subjects import Subjects

# pytest's importlib mode does not put test directories on the path; the helpers live next to this file.
from support.agent_harness import HOST, Running
from support.fake_scheduler import FakeScheduler


@pytest.fixture
def subjects(subject_prefix: str) -> Subjects:
    return Subjects(subject_prefix)


@pytest.fixture
async def scheduler(nc: Client, subjects: Subjects) -> AsyncIterator[FakeScheduler]:
    fake = FakeScheduler(nc, subjects)
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
def make_config(nats_url: str, subject_prefix: str, tmp_path: Path) -> Callable[..., AgentConfig]:
    def build(**overrides: Any) -> AgentConfig:
        data: dict[str, Any] = {
            "host_id": HOST,
            "spool_dir": str(tmp_path / "spool"),
            "devices": [
                {"device_id": f"{subject_prefix}-d1", "labels": {"platform": "android"}, "env": {"SERIAL": "d1"}},
                {"device_id": f"{subject_prefix}-d2"},
            ],
            "nats_url": nats_url,
            "subject_prefix": subject_prefix,
            "stop_grace_s": 0.5,
            "shutdown_grace_s": 5,
            "request_timeout_s": 1,
            "drain_timeout_s": 1,
            **overrides,
        }
        return parse_config(data)

    return build


@pytest.fixture
async def start_agent() -> AsyncIterator[Callable[[AgentConfig], Running]]:
    started: list[Running] = []

    def start(config: AgentConfig) -> Running:
        running = Running(config)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop.set()
    await asyncio.gather(*(asyncio.wait_for(r.task, 60) for r in started), return_exceptions=True)
