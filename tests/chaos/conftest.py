"""Fixtures of the chaos tests: control-plane processes of the test's own, killed or stopped at will, and the
fault suite's lab (its own plane, real agents, a step journal, the invariant checker)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from support.agent_e2e import Plane
from support.fault_lab import FaultLab, MakeLab, start_plane
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


@pytest.fixture
async def make_lab(
    database_url: str, nats_url: str, subject_prefix: str, tmp_path: Path, nc: NatsClient
) -> AsyncIterator[MakeLab]:
    """Start this test's own control plane (optionally through a proxy, on a cluster, with more environment) and
    return its `FaultLab`; agents, services and streams are removed after the test."""
    made: list[tuple[FaultLab | None, Plane]] = []

    async def make(
        *,
        database: str | None = None,
        nats: str | None = None,
        client: NatsClient | None = None,
        env: Mapping[str, str] | None = None,
        **settings: Any,
    ) -> FaultLab:
        plane = start_plane(
            database or database_url, nats or nats_url, subject_prefix, tmp_path / f"plane{len(made)}", env=env,
            **settings,
        )  # fmt: skip
        made.append((None, plane))
        await plane.ready()
        lab = FaultLab(client or nc, plane, tmp_path / f"lab{len(made)}", database_url)
        made[-1] = (lab, plane)
        return lab

    yield make
    for lab, plane in made:
        if lab is not None:
            await asyncio.to_thread(lab.stop)
        await asyncio.to_thread(plane.stop)
    with contextlib.suppress(Exception):
        await delete_streams(nc, subject_prefix)


@pytest.fixture
async def fault_lab(make_lab: MakeLab) -> FaultLab:
    """This test's lab on its own control plane, with the suite's settings."""
    return await make_lab()
