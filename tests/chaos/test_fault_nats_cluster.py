"""ARCHITECTURE's scale path on its real engine: a three-node NATS cluster on loopback (`devsched.embedded.
NatsCluster`, `sync_interval: always`), streams and consumers of three replicas (`DEVSCHED_STREAM_REPLICAS=3`),
services and agents given every node's URL. A node is SIGKILLed under load: nothing is lost, service goes on.

Ends with the shared invariant checker, reading the streams back from the surviving nodes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient

from devsched.embedded import NatsCluster
from support.fault_lab import FaultLab, MakeLab
from support.invariants import stream_name
from support.polling import eventually
from support.scheduler_harness import ErrorReply

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three routed nats-servers with JetStream, on free loopback ports, stopped after the test."""
    with NatsCluster(tmp_path / "cluster", size=3) as started:
        yield started


@pytest.fixture
async def cluster_nc(cluster: NatsCluster) -> AsyncIterator[NatsClient]:
    """A client of the cluster that fails over to any node."""

    async def quiet(_: Exception) -> None:
        """A node going away is the point."""

    client = await nats.connect(
        servers=cluster.urls, connect_timeout=2, reconnect_time_wait=0.1, max_reconnect_attempts=-1, error_cb=quiet
    )
    yield client
    await client.close()


async def test_a_node_of_a_three_node_cluster_killed_under_load_loses_nothing(
    cluster: NatsCluster, cluster_nc: NatsClient, make_lab: MakeLab
) -> None:
    lab: FaultLab = await make_lab(nats=cluster.url, client=cluster_nc, stream_replicas=3)
    js = cluster_nc.jetstream()
    events_stream = stream_name(lab.prefix, "EVENTS")
    for stream in (stream_name(lab.prefix, "ASSIGNMENTS"), events_stream):
        info = await js.stream_info(stream)
        assert info.config.num_replicas == 3
        assert info.cluster is not None
        assert len(info.cluster.replicas or []) == 2
    await asyncio.gather(lab.agent("a1", "a2").ready(), lab.agent("b1", "b2").ready())
    tasks: list[str] = []

    async def submit_until(stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                tasks.append(await lab.submit(lab.journal.plan(0.2), lease_ttl_s=10))
            except (nats.errors.Error, ErrorReply):
                await asyncio.sleep(0.1)  # not acknowledged: a leader was being elected

    async with lab.inv.watch():
        stop = asyncio.Event()
        load = asyncio.create_task(submit_until(stop))
        await eventually(lambda: len(tasks) >= 10, timeout=30, message="load on the cluster")
        leader = (await js.stream_info(events_stream)).cluster.leader  # type: ignore[union-attr]
        assert leader is not None
        await asyncio.to_thread(cluster.node(leader).kill)  # SIGKILL the node that leads the events stream
        acknowledged_at_kill = len(tasks)
        await eventually(lambda: len(tasks) >= acknowledged_at_kill + 15, timeout=45, message="service goes on")
        stop.set()
        await load
        views = await lab.run_all(tasks, within=60)

    async def new_leader() -> bool:
        try:
            info = await js.stream_info(events_stream)
        except nats.errors.TimeoutError:  # the stream's group may still be electing: not yet
            return False
        return info.cluster is not None and info.cluster.leader not in (None, leader)

    await eventually(new_leader, timeout=20, message="another node leads the events stream")
    assert {v["status"] for v in views.values()} == {"done"}
    await lab.inv.check()
