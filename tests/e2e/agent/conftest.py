"""Fixtures of the agent's end-to-end tests: real agents against a real scheduler, sweeper, NATS and Postgres.

Tests that only need the control plane to answer share one per module (`lab`); tests that pause, kill or
restart a control-plane process get their own (`own_lab`), so no other test sees the fault.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from support.agent_e2e import AgentLab, Plane
from support.databases import create_test_database, drop_database, in_thread
from support.scheduler_harness import delete_streams_at
from support.servers import NatsHandle, PostgresHandle


@pytest.fixture(scope="module")
def shared_plane(
    nats_server: NatsHandle,
    postgres_server: PostgresHandle,
    database_template: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Plane]:
    """A scheduler and a sweeper for the module's tests (each test has its own hosts, devices and label)."""
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


@pytest.fixture
async def lab(shared_plane: Plane, nc: NatsClient, tmp_path: Path) -> AsyncIterator[AgentLab]:
    """This test's corner of the module's control plane; its agents are stopped after the test."""
    lab = AgentLab(nc, shared_plane, tmp_path)
    yield lab
    await asyncio.to_thread(lab.stop)


@pytest.fixture
def plane_settings() -> dict[str, float]:
    """Overrides of the own control plane's settings (a test parametrizes or overrides this)."""
    return {}


@pytest.fixture
async def own_plane(
    database_url: str, nats_url: str, subject_prefix: str, tmp_path: Path, plane_settings: dict[str, float]
) -> AsyncIterator[Plane]:
    """A scheduler and a sweeper of this test's own, free to pause, kill and restart."""
    logs = tmp_path / "plane"
    logs.mkdir()
    plane = Plane.start(database_url, nats_url, subject_prefix, logs, **plane_settings)
    try:
        await plane.ready()
        yield plane
    finally:
        await asyncio.to_thread(plane.stop)
        await delete_streams_at(nats_url, subject_prefix)


@pytest.fixture
async def own_lab(own_plane: Plane, nc: NatsClient, tmp_path: Path) -> AsyncIterator[AgentLab]:
    """This test's lab on its own control plane; agents stopped before the plane."""
    lab = AgentLab(nc, own_plane, tmp_path)
    yield lab
    await asyncio.to_thread(lab.stop)
