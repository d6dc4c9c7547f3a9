"""nats-server faults under real services and agents: SIGKILLed under publish load, and frozen past every
request timeout. The server runs with `sync_interval: always` (devsched.embedded.NatsServer, as in `devsched up`):
what JetStream acknowledged is on disk, so the relay's marks are never ahead of the streams.

Each scenario asserts its own expected outcome and ends with the shared invariant checker, whose "every outbox
row published once" reads the streams back after the fault.
"""

from __future__ import annotations

import asyncio
import json

import asyncpg
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient

from support.fault_lab import FaultLab
from support.invariants import plain_dsn
from support.polling import eventually
from support.scheduler_harness import ErrorReply, api, raw_request
from support.servers import NatsHandle

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]


async def _sent(database_url: str) -> int:
    conn = await asyncpg.connect(plain_dsn(database_url))
    try:
        return int(await conn.fetchval("SELECT count(*) FROM outbox WHERE id NOT IN (SELECT id FROM outbox_unsent)"))
    finally:
        await conn.close()


async def test_nats_sigkilled_under_publish_load_loses_no_acknowledged_message(
    fault_lab: FaultLab, nats_server: NatsHandle, database_url: str
) -> None:
    lab = fault_lab
    await lab.agent("d1", "d2", "d3").ready()
    tasks: list[str] = []
    refused = 0

    async def submit_until(stop: asyncio.Event) -> None:
        nonlocal refused
        while not stop.is_set():
            try:
                tasks.append(await lab.submit(lab.journal.plan(0.1), lease_ttl_s=15))
            except (nats.errors.Error, ErrorReply):
                refused += 1  # not acknowledged: NATS was down
                await asyncio.sleep(0.1)

    async with lab.inv.watch():
        stop = asyncio.Event()
        load = asyncio.create_task(submit_until(stop))
        await eventually(lambda: len(tasks) >= 15, timeout=20, message="publish load")
        # Rows are published at once and marked sent in batches a moment later: kill once some are marked.
        sent_before = await eventually(lambda: _sent(database_url), timeout=20, message="outbox rows marked sent")
        await asyncio.to_thread(nats_server.kill)  # SIGKILL: nothing flushed on the way out
        await asyncio.sleep(0.5)
        await asyncio.to_thread(nats_server.start)
        await eventually(lambda: len(tasks) >= 30, timeout=30, message="load goes on after the restart")
        stop.set()
        await load
        views = await lab.run_all(tasks, within=60)

    assert sent_before > 0
    assert {v["status"] for v in views.values()} == {"done"}
    # Acknowledged by JetStream before the kill (hence marked sent) and still in the streams after it, once:
    # the checker counts the events stream against the outbox and the assignments stream's sequence.
    await lab.inv.check()


async def test_nats_frozen_past_the_request_timeout_is_survived(
    fault_lab: FaultLab, nats_server: NatsHandle, nc: NatsClient
) -> None:
    lab = fault_lab
    agent = await lab.agent("d1", "d2").ready()
    async with lab.inv.watch():
        task_id = await lab.submit(lab.journal.plan(*[0.5] * 8), lease_ttl_s=12)
        await eventually(lambda: lab.journal.starts_of(task_id).get(1), timeout=20, message="running")
        nats_server.pause()  # SIGSTOP: connections stay open, nothing answers
        try:
            # past the agent's request timeout (1 s), a client's (2 s) and the relay's publish timeout (5 s); the
            # unanswered submit may still be served after the thaw (it is not acknowledged: either is right)
            body = json.dumps({"plan": {"steps": [{"name": "x", "action": "noop"}]}}).encode()
            with pytest.raises(nats.errors.TimeoutError):
                await raw_request(nc, api(lab.prefix, "tasks.submit"), body, timeout=2)
            await asyncio.sleep(4.5)
        finally:
            nats_server.resume()
        view = await lab.wait_status(task_id, "done", "failed", within=40)
        after = await lab.submit(lab.journal.plan(0.1), lease_ttl_s=10)
        await lab.wait_status(after, "done", within=30)

    # The 12 s lease outlived the 6.5 s freeze: the agent's renewals failed meanwhile, then went through.
    assert (view["status"], view["attempt_count"]) == ("done", 1)
    assert agent.lines("renewal failed, will retry", task_id=task_id)
    assert lab.plane.scheduler.running
    await lab.inv.check()
