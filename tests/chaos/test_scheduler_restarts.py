"""The scheduler killed, restarted and stopped: committed work is never lost, acknowledged work never dropped."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable

import nats.errors
import pytest
from nats.aio.client import Client as NatsClient

from devsched.protocol.subjects import Subjects
from devsched.store import Store
from support.polling import eventually
from support.scheduler_harness import (
    Spawn,
    TestHost,
    api,
    call,
    call_retrying,
    get_task,
    plan,
    stream_messages,
    submit,
)

pytestmark = pytest.mark.chaos


async def test_scheduler_killed_between_commit_and_publish_delivers_after_restart(
    spawn: Spawn, nc: NatsClient, subject_prefix: str, database_url: str, make_host: Callable[..., TestHost]
) -> None:
    # A replica whose relay never runs stands for one killed after each commit and before its publish.
    doomed = spawn("scheduler", relay_enabled=False)
    await doomed.wait_logged("serving")
    host = make_host()
    await host.register("d1", "d2")
    ids = [await submit(nc, subject_prefix) for _ in range(3)]
    store = Store.connect(database_url)
    try:

        async def assigned_twice() -> bool:
            views = [await get_task(nc, subject_prefix, t) for t in ids]
            return bool(sum(v["status"] == "assigned" for v in views) == 2)

        await eventually(assigned_twice, message="two tasks assigned")
        assert await store.unsent_count() == 3 + 2 * 2  # 3 submitted, 2 x (assigned event + assignment)
        assert await host.no_assignment(0.3)
        doomed.kill()  # SIGKILL: no shutdown path runs

        survivor = spawn("scheduler")
        await survivor.wait_logged("serving")
        got = await host.assignments(2)
        assert {a.task_id for a in got} <= set(ids)
        await eventually(lambda: _unsent_zero(store), message="outbox relayed after the restart")
        js = nc.jetstream()
        events = await stream_messages(js, Subjects(subject_prefix).events_stream)
        kinds = sorted(json.loads(m.data)["event"] for m in events)
        assert kinds == ["assigned", "assigned", "submitted", "submitted", "submitted"]
        assert len({m.headers["Nats-Msg-Id"] for m in events if m.headers}) == 5
        assert await host.no_assignment(0.3)  # nothing twice
    finally:
        await store.close()


async def test_scheduler_killed_after_publishing_before_marking_republishes_once(
    spawn: Spawn, nc: NatsClient, subject_prefix: str, database_url: str, make_host: Callable[..., TestHost]
) -> None:
    # A replica publishes its commits at once and marks them later: one killed in between leaves messages
    # that are in the streams but unsent in the table. They are published again, and stored once.
    doomed = spawn("scheduler", relay_mark_delay_s=3600, relay_tick_s=3600)
    await doomed.wait_logged("serving")
    host = make_host()
    await host.register("d1", "d2")
    ids = [await submit(nc, subject_prefix) for _ in range(3)]
    got = await host.assignments(2)  # published at once: no relay pass ran
    assert {a.task_id for a in got} <= set(ids)
    js = nc.jetstream()
    events_stream = Subjects(subject_prefix).events_stream

    async def all_events_published() -> bool:
        return len(await stream_messages(js, events_stream)) == 5

    await eventually(all_events_published, message="3 submitted + 2 assigned published at once")
    store = Store.connect(database_url)
    try:
        assert await store.unsent_count() == 7, "published, never marked"
        doomed.kill()  # SIGKILL: the marks never happen

        survivor = spawn("scheduler")
        await survivor.wait_logged("serving")
        await eventually(lambda: _unsent_zero(store), message="outbox relayed again after the restart")
        events = await stream_messages(js, events_stream)
        assert sorted(json.loads(m.data)["event"] for m in events) == [
            "assigned",
            "assigned",
            "submitted",
            "submitted",
            "submitted",
        ], "the copies were dropped by message id"
        assert len({m.headers["Nats-Msg-Id"] for m in events if m.headers}) == 5
        assert await host.no_assignment(0.3), "no assignment twice"
        assert survivor.logged("already in the stream (republished after a crash)")
    finally:
        await store.close()


async def _unsent_zero(store: Store) -> bool:
    return await store.unsent_count() == 0


async def test_cancellation_request_survives_a_restart_over_nats(
    spawn: Spawn, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    first = spawn("scheduler")
    await first.wait_logged("serving")
    host = make_host()
    await host.register("d1")
    task_id = await submit(nc, subject_prefix, lease_ttl_s=60)
    a = await host.next_assignment()
    await host.claim(a)
    reply = await call(nc, api(subject_prefix, "tasks.cancel"), {"task_id": task_id})
    assert reply["cancel_requested"] is True
    first.kill()  # before the host renews again

    second = spawn("scheduler")
    await second.wait_logged("serving")
    renewed = await call_retrying(nc, host.subject("renew"), a.lease)
    assert renewed["cancel_requested"] is True
    assert (await host.report(a, "cancelled"))["status"] == "cancelled"


async def test_sigterm_finishes_in_flight_requests_while_a_replica_takes_over(
    spawn: Spawn, nc: NatsClient, subject_prefix: str
) -> None:
    leaving, staying = spawn("scheduler"), spawn("scheduler")
    await asyncio.gather(leaving.wait_logged("serving"), staying.wait_logged("serving"))
    total = 300
    replies: list[dict[str, object]] = []
    failures: list[str] = []
    body = json.dumps({"plan": plan()}).encode()

    async def one(i: int) -> None:
        await asyncio.sleep(i * 0.004)  # spread over ~1.2 s, across the SIGTERM
        try:
            msg = await nc.request(api(subject_prefix, "tasks.submit"), body, timeout=10)
        except nats.errors.Error as exc:
            failures.append(type(exc).__name__)
            return
        if msg.headers and "Nats-Service-Error-Code" in msg.headers:
            failures.append(msg.headers["Nats-Service-Error-Code"])
        else:
            replies.append(json.loads(msg.data))

    burst = asyncio.gather(*(one(i) for i in range(total)))
    await asyncio.sleep(0.4)
    os.kill(leaving.pid, signal.SIGTERM)
    await burst
    assert await leaving.wait_exit() == 0, leaving.tail()
    assert leaving.logged("stopped")
    assert failures == []
    assert len(replies) == total
    listed = await call(nc, api(subject_prefix, "tasks.list"), {"limit": 1000})
    assert len(listed["tasks"]) == total
    served_by_leaving = sum(line.get("msg") == "submitted" for line in leaving.log_lines())
    assert 0 < served_by_leaving < total
