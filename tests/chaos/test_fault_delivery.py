"""JetStream delivery faults between the assignments consumer and a real agent: AckWait and MaxDeliver.

The agent reaches NATS through the suite's proxy, which holds back or drops JetStream deliveries (whole NATS
frames) while everything else passes. Each scenario ends with the shared invariant checker.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from support.fault_lab import FaultLab, MakeLab
from support.invariants import stream_name
from support.polling import eventually
from support.servers import NatsHandle
from support.tcp_proxy import TcpProxy, deliveries

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

#: How long the agent's pull waits for assignments (devsched.agent.intake.FETCH_WAIT_S).
AGENT_FETCH_WAIT_S = 5.0


@pytest.fixture
async def nats_proxy(nats_server: NatsHandle) -> AsyncIterator[TcpProxy]:
    """A NATS-aware proxy in front of the session's NATS server (ask for it before the lab)."""
    host, port = nats_server.url.removeprefix("nats://").rsplit(":", 1)
    async with TcpProxy((host, int(port)), nats=True) as proxy:
        yield proxy


async def test_an_assignment_redelivered_after_ack_wait_to_a_slow_agent_runs_once(
    nats_proxy: TcpProxy, make_lab: MakeLab
) -> None:
    ack_wait = 1.5
    lab: FaultLab = await make_lab(consumer_ack_wait_s=ack_wait)
    agent = await lab.agent("d1", nats_url=nats_proxy.url()).ready()
    # The first delivery reaches the agent only after AckWait has run out and the agent's pull has timed out, so
    # JetStream delivers it again on the next pull, before the first copy arrives.
    nats_proxy.hold_when(deliveries(first_only=True), AGENT_FETCH_WAIT_S + ack_wait + 1.0)
    task_id = await lab.submit(lab.journal.plan(0.2, 0.2, 0.2), lease_ttl_s=20)
    async with lab.inv.watch():
        view = await lab.wait_status(task_id, "done", "failed", within=40)
        dropped = await agent.wait_line("duplicate assignment delivery dropped", task_id=task_id, timeout=20)

    assert nats_proxy.seen[2] >= 1  # JetStream's redelivery went out
    assert dropped["attempt"] == 1
    assert (view["status"], view["attempt_count"]) == ("done", 1)
    assert lab.journal.starts_of(task_id) == {1: ["s1", "s2", "s3"]}  # the plan ran once
    await lab.inv.check()


async def test_max_deliver_exhausted_while_the_host_is_offline_the_resync_runs_the_attempt_when_it_is_back(
    nats_proxy: TcpProxy, make_lab: MakeLab, nc: NatsClient
) -> None:
    # Deliveries go out one per pull of the agent (one device: a batch of one), a pull every 5 s: the second and
    # last delivery of attempt 1's assignment ~5 s after it, the advisory ~5 s later. JetStream then gives up on
    # the message; the scheduler's resync publishes the assignment again (a pass every second, for attempts
    # unclaimed for 2 s): the copies made while the deliveries are dropped are lost the same way, the first one
    # after the heal reaches the agent. The lease (60 s) outlasts all of it, so attempt 1 runs: no attempt spent.
    ttl = 60
    lab: FaultLab = await make_lab(consumer_ack_wait_s=1, consumer_max_deliver=2, resync_interval_s=1, resync_after_s=2)
    agent = await lab.agent("d1", nats_url=nats_proxy.url()).ready()
    advisories: list[dict[str, object]] = []

    async def advised(msg: Msg) -> None:
        advisories.append(json.loads(msg.data))

    consumer = f"host-{agent.host_id}"
    subject = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream_name(lab.prefix, 'ASSIGNMENTS')}.{consumer}"
    sub = await nc.subscribe(subject, cb=advised)
    await nc.flush()
    try:
        # The host is offline for its assignments: its pulls reach the server, every delivery is lost.
        nats_proxy.drop_when(deliveries())
        task_id = await lab.submit(lab.journal.plan(0.2), lease_ttl_s=ttl, max_attempts=3)
        async with lab.inv.watch():
            # attempt 1's assignment is the stream's first message
            first = await eventually(
                lambda: [a for a in advisories if a["stream_seq"] == 1], timeout=20, message="MaxDeliver advisory"
            )
            nats_proxy.heal()
            healed = await lab.inv.db_now()
            await lab.inv.recovered(healed, ttl_s=ttl, sweep_interval_s=0.2, grace_s=ttl)
            view = await lab.wait_status(task_id, "done", "failed", within=30)
    finally:
        await sub.unsubscribe()

    assert first[0]["deliveries"] == 2
    attempts = view["attempts"]
    assert [(a["status"], a["dispatched_at"] is None) for a in attempts] == [("done", False)]
    assert lab.journal.starts_of(task_id) == {1: ["s1"]}  # attempt 1 ran, once
    assert lab.plane.scheduler_lines("assignment resent", task_id=task_id, trigger="timer")
    await lab.inv.check()
