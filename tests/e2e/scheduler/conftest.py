"""The control plane as processes: one scheduler and one sweeper per test module, shared by its tests.

Starting two Python processes costs about a second; sharing them across a module's tests keeps the suite
fast. Tests stay isolated by giving every test its own host, devices and device labels (`Lab`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from nats.aio.client import Client as NatsClient

from support.databases import create_test_database, drop_database, in_thread
from support.scheduler_harness import (
    ControlPlane,
    Lab,
    delete_streams_at,
    scheduler_process,
    service_env,
    sweeper_process,
)
from support.servers import NatsHandle, PostgresHandle


@pytest.fixture(scope="module")
def control_plane(
    nats_server: NatsHandle,
    postgres_server: PostgresHandle,
    database_template: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ControlPlane]:
    """`devsched-scheduler` and `devsched-sweeper` as processes; SIGTERMed (and must exit 0) after the module."""
    name = create_test_database(postgres_server.dsn(), database_template)
    prefix = f"e{uuid.uuid4().hex[:10]}"
    logs = tmp_path_factory.mktemp("control-plane")
    env = service_env(postgres_server.url(name), nats_server.url, prefix)
    scheduler = scheduler_process(env, logs / "scheduler.log").start()
    sweeper = sweeper_process(env, logs / "sweeper.log").start()
    try:

        async def ready() -> None:
            await asyncio.gather(scheduler.wait_logged("serving"), sweeper.wait_logged("sweeping"))

        in_thread(lambda: asyncio.run(ready()))
        yield ControlPlane(prefix, postgres_server.url(name), nats_server.url, scheduler, sweeper)
        assert scheduler.stop() == 0, scheduler.tail()
        assert sweeper.stop() == 0, sweeper.tail()
        assert scheduler.logged("stopped")
        assert sweeper.logged("stopped")
    finally:
        scheduler.kill()
        sweeper.kill()
        in_thread(lambda: asyncio.run(delete_streams_at(nats_server.url, prefix)))
        drop_database(postgres_server.dsn(), name)


@pytest.fixture
async def lab(control_plane: ControlPlane, nc: NatsClient) -> AsyncIterator[Lab]:
    """This test's own corner of the shared control plane."""
    lab = Lab(nc, control_plane.prefix)
    yield lab
    await lab.close()
