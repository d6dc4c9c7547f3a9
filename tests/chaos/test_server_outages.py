"""Postgres and NATS going away under running services: 503s meanwhile, recovery after, nothing lost."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest
from nats.aio.client import Client as NatsClient

from support.polling import eventually
from support.scheduler_harness import (
    ErrorReply,
    Spawn,
    TestHost,
    api,
    call,
    call_retrying,
    get_task,
    plan,
    raw_request,
    status_of,
    submit,
    task_events,
)
from support.servers import NatsHandle, PostgresHandle

pytestmark = pytest.mark.chaos


async def test_postgres_outage_answers_503_and_the_services_recover(
    spawn: Spawn,
    nc: NatsClient,
    subject_prefix: str,
    postgres_server: PostgresHandle,
    make_host: Callable[..., TestHost],
) -> None:
    scheduler, sweeper = spawn("scheduler"), spawn("sweeper")
    await asyncio.gather(scheduler.wait_logged("serving"), sweeper.wait_logged("sweeping"))
    host = make_host()
    await host.register("d1")
    before = await submit(nc, subject_prefix, lease_ttl_s=600)  # a lease no outage here can outlast
    held = await host.next_assignment()  # assigned before the outage

    await asyncio.to_thread(postgres_server.stop)
    try:
        for subject, body in (
            (api(subject_prefix, "tasks.get"), {"task_id": before}),
            (api(subject_prefix, "tasks.submit"), {"plan": plan()}),
            (host.subject("heartbeat"), {}),
        ):
            msg = await raw_request(nc, subject, json.dumps(body).encode(), timeout=15)
            assert msg.headers is not None
            assert msg.headers["Nats-Service-Error-Code"] == "503"
            assert json.loads(msg.data)["error"]["code"] == "unavailable"
        await asyncio.sleep(0.5)  # the loops meet the outage too
        assert scheduler.running  # still up
        assert sweeper.running
    finally:
        await asyncio.to_thread(postgres_server.start)

    assert (await call_retrying(nc, api(subject_prefix, "tasks.get"), {"task_id": before}))["status"] == "assigned"
    # Work flows again end to end: assignment loop, relay, and sweeper.
    expiring = await submit(nc, subject_prefix, lease_ttl_s=1, max_attempts=1)
    await host.claim(held)
    await host.report(held)
    a = await host.next_assignment(timeout=15)
    assert a.task_id == expiring
    # not claimed (a 1 s lease is too short to rely on a claim on a loaded machine): it expires either way
    await status_of(nc, subject_prefix, expiring, "failed", within=15)


async def test_nats_restart_is_survived_without_losing_acknowledged_work(
    spawn: Spawn, nc: NatsClient, subject_prefix: str, nats_server: NatsHandle, make_host: Callable[..., TestHost]
) -> None:
    scheduler, sweeper = spawn("scheduler"), spawn("sweeper")
    await asyncio.gather(scheduler.wait_logged("serving"), sweeper.wait_logged("sweeping"))
    host = make_host()
    await host.register("d1", "d2")
    running = await submit(nc, subject_prefix)
    expiring = await submit(nc, subject_prefix, lease_ttl_s=3, max_attempts=1)
    got = {a.task_id: a for a in await host.assignments(2)}
    for a in got.values():
        await host.claim(a)

    await asyncio.to_thread(nats_server.restart)  # the expiring lease runs out meanwhile

    await call_retrying(nc, host.subject("renew"), got[running].lease)
    assert (await host.report(got[running]))["status"] == "done"
    view = await status_of(nc, subject_prefix, expiring, "failed", within=15)
    assert view["reason"] == "lease_expired"

    after = await call_retrying(nc, api(subject_prefix, "tasks.submit"), {"plan": plan()})
    a = await host.next_assignment(timeout=15)  # relay and consumer work again
    assert a.task_id == after["task_id"]

    async def events_complete() -> bool:
        done = [e["event"] for e in await task_events(host.js, subject_prefix, running)]
        failed = [e["event"] for e in await task_events(host.js, subject_prefix, expiring)]
        return done == ["submitted", "assigned", "dispatched", "done"] and failed[-1:] == ["failed"]

    await eventually(events_complete, timeout=15, message="every event published after the restart")
    assert (await get_task(nc, subject_prefix, running))["status"] == "done"


async def test_scheduler_started_before_nats_waits_and_serves(
    spawn: Spawn, nc: NatsClient, subject_prefix: str, nats_server: NatsHandle
) -> None:
    await asyncio.to_thread(nats_server.stop)
    try:
        scheduler = spawn("scheduler")
        await asyncio.sleep(1.0)
        assert scheduler.running  # retrying, not dead
    finally:
        await asyncio.to_thread(nats_server.start)
    await scheduler.wait_logged("serving")
    await call_retrying(nc, api(subject_prefix, "hosts.list"), {})
    with pytest.raises(ErrorReply):
        await call(nc, api(subject_prefix, "tasks.get"), {"task_id": "x"})
