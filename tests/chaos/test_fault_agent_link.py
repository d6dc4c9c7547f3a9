"""Faults of the link between a real agent and NATS, through the suite's TCP proxy.

Each scenario runs real agents whose steps write the journal, asserts its own expected outcome, and ends with
the shared invariant checker (`support.invariants`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from support.fault_lab import FaultLab
from support.polling import eventually
from support.servers import NatsHandle
from support.tcp_proxy import TcpProxy, replies_to, sometimes

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]


@pytest.fixture
async def nats_proxy(nats_server: NatsHandle) -> AsyncIterator[TcpProxy]:
    """A NATS-aware proxy in front of the session's NATS server (ask for it before the lab: it must outlive the
    agents, which are stopped with the lab)."""
    host, port = nats_server.url.removeprefix("nats://").rsplit(":", 1)
    async with TcpProxy((host, int(port)), nats=True) as proxy:
        yield proxy


async def test_a_200ms_jittered_link_changes_no_outcome(nats_proxy: TcpProxy, fault_lab: FaultLab) -> None:
    lab = fault_lab
    # from the agent's first byte, both ways: registration, fetches, claims, renewals, reports
    nats_proxy.delay(0.2, 0.1, both_ways=True)
    await lab.agent("d1", "d2", nats_url=nats_proxy.url(), request_timeout_s=3).ready(timeout=60)
    tasks = [await lab.submit(lab.journal.plan(0.3, 0.3), lease_ttl_s=6) for _ in range(4)]
    views = await lab.run_all(tasks, within=60)

    assert {v["status"] for v in views.values()} == {"done"}
    assert {v["attempt_count"] for v in views.values()} == {1}  # 6 s leases outlast any 300 ms delay
    nats_proxy.heal()
    await lab.inv.check()


async def test_replies_lost_on_the_way_to_the_agent_are_retried_and_counted_once(
    nats_proxy: TcpProxy, fault_lab: FaultLab
) -> None:
    lab = fault_lab
    agent = await lab.agent("d1", "d2", nats_url=nats_proxy.url()).ready()
    async with lab.inv.watch():
        # half of the replies to the agent's requests (claims, renewals, reports, heartbeats) never arrive
        nats_proxy.drop_when(sometimes(replies_to(f"_INBOX.{agent.host_id}."), 0.5))
        tasks = [await lab.submit(lab.journal.plan(0.3, 0.3), lease_ttl_s=8, max_attempts=3) for _ in range(4)]
        await eventually(lambda: nats_proxy.counts["dropped"] >= 4, timeout=30, message="replies dropped")
        views = await lab.run_all(tasks, within=60)
        nats_proxy.heal()

    assert {v["status"] for v in views.values()} == {"done"}, {
        t: (v["status"], v.get("reason")) for t, v in views.items()
    }
    # a report whose reply was lost is sent again and answered with what was recorded: one outcome per attempt
    reports = lab.plane.scheduler_lines("reported")
    assert {(r["task_id"], r["attempt"]) for r in reports if not r["duplicate"]} == {
        (t, v["attempt_count"]) for t, v in views.items()
    }
    await lab.inv.check()


async def test_a_blackholed_agent_loses_its_attempt_to_another_host(nats_proxy: TcpProxy, fault_lab: FaultLab) -> None:
    lab, ttl = fault_lab, 3
    partitioned = await lab.agent("a1", nats_url=nats_proxy.url()).ready()
    task_id = await lab.submit([lab.journal.step(f"s{i}", 0.5) for i in range(1, 11)], lease_ttl_s=ttl)
    await eventually(lambda: lab.journal.starts_of(task_id).get(1), timeout=20, message="attempt 1 running")
    healthy = await lab.agent("b1").ready()

    async with lab.inv.watch():
        nats_proxy.blackhole()  # half-open: the agent's socket stays open, nothing comes back
        cut_at = await lab.inv.db_now()
        await lab.inv.recovered(cut_at, ttl_s=ttl, sweep_interval_s=0.2, grace_s=0)  # another device is free
        view = await lab.wait_status(task_id, "done", within=30)
        nats_proxy.heal()  # the stale connection is reset; the agent reconnects

    assert [(a["attempt"], a["status"], a["host_id"]) for a in view["attempts"]] == [
        (1, "expired", partitioned.host_id),
        (2, "done", healthy.host_id),
    ]
    ended = await partitioned.wait_line("attempt ended", task_id=task_id, attempt=1)
    assert ended["reason"].startswith("lease_lost")  # its own deadline passed: it stopped at a step boundary
    steps_run = lab.journal.starts_of(task_id)
    assert len(steps_run[1]) < 10
    assert len(steps_run[2]) == 10
    # back on the network, the partitioned host takes work again
    again = await lab.submit(lab.journal.plan(0.1), selector={"device_id": lab.device("a1")})
    assert (await lab.wait_status(again, "done", within=30))["attempts"][0]["host_id"] == partitioned.host_id

    await lab.inv.check()


async def test_connection_resets_lose_no_work(nats_proxy: TcpProxy, fault_lab: FaultLab) -> None:
    lab = fault_lab
    await lab.agent("d1", "d2", nats_url=nats_proxy.url()).ready()
    async with lab.inv.watch():
        tasks = [await lab.submit(lab.journal.plan(0.4, 0.4, 0.4), lease_ttl_s=10) for _ in range(6)]
        for _ in range(3):
            await eventually(lambda: nats_proxy.connections > 0, timeout=10, message="agent reconnected")
            await asyncio.sleep(1.0)
            nats_proxy.reset()
        views = await lab.run_all(tasks, within=90)

    assert nats_proxy.counts["resets"] >= 3
    assert {v["status"] for v in views.values()} == {"done"}
    # An assignment lost in a reset socket is redelivered after AckWait; a lease that ran out meanwhile is
    # retried: either way at most one attempt is done.
    assert all(sum(a["status"] == "done" for a in v["attempts"]) == 1 for v in views.values())
    await lab.inv.check()
