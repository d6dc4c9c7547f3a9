"""Fixtures of the agent's end-to-end tests: real agents against a real scheduler, sweeper, NATS and Postgres.

Tests that only need the control plane to answer share one per module (`lab`); tests that pause, kill or
restart a control-plane process get their own (`own_lab`), so no other test sees the fault.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from support.agent_e2e import AgentLab, Plane
from support.scheduler_harness import delete_streams_at


@pytest.fixture
async def lab(agent_plane: Plane, nc: NatsClient, tmp_path: Path) -> AsyncIterator[AgentLab]:
    """This test's corner of the module's control plane; its agents are stopped after the test."""
    lab = AgentLab(nc, agent_plane, tmp_path)
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
