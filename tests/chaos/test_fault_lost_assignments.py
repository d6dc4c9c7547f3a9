"""Assignments JetStream lost before their host fetched them: the scheduler's resync publishes them again from the
database, and every task runs on its first attempt (no lease runs out, no attempt is spent).

A: the assignments stream purged while the host's agent is down, then the agent started again.
B: nats-server stopped, its JetStream store deleted, started again on the same port: the streams and the consumers
come back without a restart of any service, and a live agent takes new work through its consumer made again.

The agent whose work is lost is SIGKILLed (a SIGTERMed agent withdraws its devices, and nothing would be assigned
to it); the hosts' heartbeat interval is 5 s, so its host stays online (15 s) while its tasks are assigned. Each
task allows one attempt, with a lease far longer than the scenario: one spent attempt would fail it.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.errors import NotFoundError

from devsched.embedded import NatsServer
from devsched.scheduler.resync import REGISTERED_MIN_AGE_S
from support.fault_lab import FaultLab, MakeLab
from support.invariants import stream_name
from support.polling import eventually

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

#: Long enough that no lease runs out in a scenario: the resync, not the sweeper, brings the work back.
TTL_S = 120


async def _assigned_and_published(lab: FaultLab, tasks: list[str], nc: NatsClient) -> None:
    """Wait until every task is assigned and its assignment is in the stream (unfetched)."""

    async def ready() -> bool:
        statuses = await lab.inv.statuses()
        if any(statuses.get(t) != "assigned" for t in tasks):
            return False
        info = await nc.jetstream().stream_info(stream_name(lab.prefix, "ASSIGNMENTS"))
        return info.state.messages >= len(tasks)

    await eventually(ready, timeout=20, message="tasks assigned and their assignments in the stream")


async def _done_on_first_attempt(lab: FaultLab, tasks: list[str]) -> None:
    views = await lab.run_all(tasks, within=60)
    for task_id, view in views.items():
        assert (view["status"], view["attempt_count"]) == ("done", 1), (task_id, view["status"], view["attempts"])
        assert [a["end_reason"] for a in view["attempts"]] == ["done"]
        assert lab.journal.starts_of(task_id) == {1: ["s1"]}, "the plan ran once, as attempt 1"


def _resent(lab: FaultLab, task_id: str) -> list[str]:
    return [line["trigger"] for line in lab.plane.scheduler_lines("assignment resent", task_id=task_id)]


async def test_assignments_purged_before_their_host_fetched_them_run_without_spending_an_attempt(
    make_lab: MakeLab, nc: NatsClient
) -> None:
    lab = await make_lab(heartbeat_interval_s=5)
    agent = await lab.agent("d1", "d2", "d3").ready()
    agent.process.kill()  # nothing fetches now; the devices stay registered, the host online
    async with lab.inv.watch():
        tasks = [await lab.submit(lab.journal.plan(0.1), lease_ttl_s=TTL_S, max_attempts=1) for _ in range(3)]
        await _assigned_and_published(lab, tasks, nc)
        js = nc.jetstream()
        assignments = stream_name(lab.prefix, "ASSIGNMENTS")
        await js.purge_stream(assignments)
        assert (await js.stream_info(assignments)).state.messages == 0

        # A registration publishes again what was assigned before it, at least REGISTERED_MIN_AGE_S ago (what
        # it assigns itself is on its way through the outbox): the time passes, nothing is awaited.
        await asyncio.sleep(REGISTERED_MIN_AGE_S)
        await agent.start().ready()  # its registration has its assignments published again
        await _done_on_first_attempt(lab, tasks)

    for task_id in tasks:
        assert "registered" in _resent(lab, task_id)
    await lab.inv.check()


async def _quiet(_: Exception) -> None:
    """Connection errors are expected while the scenario has the server down."""


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server of this test's own (requested before the lab, so it outlives the lab's services)."""
    with NatsServer(tmp_path / "own-nats") as server:
        yield server


@pytest.fixture
async def own_nc(own_nats: NatsServer) -> AsyncIterator[NatsClient]:
    """A client of `own_nats` that reconnects quickly and forever."""
    client = await nats.connect(
        own_nats.url, connect_timeout=2, reconnect_time_wait=0.1, max_reconnect_attempts=-1, error_cb=_quiet
    )
    yield client
    await client.close()


async def test_nats_losing_its_store_with_work_assigned_and_not_fetched_loses_no_attempt(
    own_nats: NatsServer, own_nc: NatsClient, make_lab: MakeLab
) -> None:
    # A timer pass every second: it creates the lost streams again without waiting for a request to need them.
    lab = await make_lab(nats=own_nats.url, client=own_nc, heartbeat_interval_s=5, resync_interval_s=1)
    lost = await lab.agent("d1", "d2").ready()
    live = await lab.agent("e1").ready()
    lost.process.kill()

    def on(device: str) -> dict[str, object]:
        return {"selector": {"labels": lab.label, "device_id": lab.device(device)}}

    js = own_nc.jetstream()
    streams = [stream_name(lab.prefix, "ASSIGNMENTS"), stream_name(lab.prefix, "EVENTS")]
    async with lab.inv.watch():
        tasks = [
            await lab.submit(lab.journal.plan(0.1), lease_ttl_s=TTL_S, max_attempts=1, **on(device))
            for device in ("d1", "d2")
        ]
        await _assigned_and_published(lab, tasks, own_nc)

        await asyncio.to_thread(own_nats.stop)
        shutil.rmtree(own_nats.store_dir)
        await asyncio.to_thread(own_nats.start)

        async def back() -> bool:
            try:
                for stream in streams:
                    await js.stream_info(stream)
                await js.consumer_info(streams[0], f"host-{live.host_id}")
            except (NotFoundError, nats.errors.Error):
                return False
            return True

        await eventually(back, timeout=30, interval=0.2, message="streams and the live host's consumer back")
        assert lab.plane.scheduler_lines("streams missing (NATS lost its store?); creating them again")

        await lost.start().ready()  # its registration has its assignments published again
        tasks.append(await lab.submit(lab.journal.plan(0.1), lease_ttl_s=TTL_S, max_attempts=1, **on("e1")))
        await _done_on_first_attempt(lab, tasks)

    for task_id in tasks[:2]:
        assert "registered" in _resent(lab, task_id)
    assert lab.plane.scheduler.running  # nothing was restarted
    assert lab.plane.sweeper.running
    # The streams lost what they held with the store: what they hold now is not the outbox's whole history.
    await lab.inv.check(streams=False)
