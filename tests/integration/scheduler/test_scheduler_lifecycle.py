"""The full lifecycle over NATS, driven by a test host that speaks only the protocol."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest
from nats.aio.client import Client as NatsClient

from devsched.protocol.subjects import Subjects
from devsched.scheduler.app import Scheduler
from devsched.sweeper.app import SweeperSettings
from support.polling import eventually
from support.scheduler_harness import (
    TestHost,
    api,
    call,
    delete_streams,
    done_result,
    get_task,
    plan,
    progress_of,
    running_scheduler,
    running_sweeper,
    scheduler_settings,
    status_of,
    stream_messages,
    submit,
    task_events,
)

pytestmark = pytest.mark.integration


async def test_full_lifecycle_over_nats(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    assert await host.register(("d1", {"platform": "android"})) == {
        "heartbeat_interval_s": 5.0,
        "claim_progress": True,
        "take_next": True,
        "renewals": True,
        "reports": True,
    }
    consumer = await host.js.consumer_info(Subjects(subject_prefix).assignments_stream, f"host-{host.host_id}")
    assert consumer.config.filter_subject == f"{subject_prefix}.assign.{host.host_id}"
    assert consumer.config.durable_name == f"host-{host.host_id}"

    body = plan("flash", "test")
    reply = await call(
        nc,
        api(subject_prefix, "tasks.submit"),
        {"name": "flash-and-test", "selector": {"labels": {"platform": "android"}}, "plan": body, "lease_ttl_s": 30},
    )
    assert reply["status"] == "queued"
    assert reply["created"] is True
    task_id = reply["task_id"]

    a = await host.next_assignment()
    assert a.task_id == task_id
    assert a.body["attempt"] == 1
    assert a.body["device_id"] == "d1"
    assert a.body["ttl_s"] == 30
    assert a.headers["Nats-Msg-Id"] == f"{task_id}.1"
    assert [s["name"] for s in a.body["plan"]["steps"]] == ["flash", "test"]

    claimed = await host.claim(a)
    assert claimed["ttl_s"] == 30
    assert claimed["cancel_requested"] is False
    assert (await get_task(nc, subject_prefix, task_id))["status"] == "dispatched"

    for index in range(2):
        renewed = await host.renew(a, progress_of(body, index))
        assert renewed["cancel_requested"] is False
        assert renewed["expires_at"] >= claimed["expires_at"]
    view = await get_task(nc, subject_prefix, task_id)
    assert view["attempts"][0]["progress"] == {"step": "test", "index": 1, "of": 2}

    report = await host.report(a, "done", result=done_result(body))
    assert report["status"] == "done"
    assert report["duplicate"] is False
    assert report["attempt"] == 1

    view = await get_task(nc, subject_prefix, task_id)
    assert view["status"] == "done"
    assert [(s["name"], s["status"]) for s in view["result"]["steps"]] == [("flash", "done"), ("test", "done")]
    assert view["attempts"][0]["status"] == "done"
    assert view["attempts"][0]["end_reason"] == "done"

    expected = ["submitted", "assigned", "dispatched", "progress", "progress", "done"]

    async def all_relayed() -> bool:
        return [e["event"] for e in await task_events(host.js, subject_prefix, task_id)] == expected

    await eventually(all_relayed, message="all events relayed")
    events = await task_events(host.js, subject_prefix, task_id)
    assert [e["seq"] for e in events] == list(range(1, 7))
    assert events[-1]["host_id"] == host.host_id
    assert events[-1]["device_id"] == "d1"
    assert events[3]["progress"] == {"step": "flash", "index": 0, "of": 2}


async def test_queued_task_says_why_it_waits(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    task_id = await submit(nc, subject_prefix, selector={"labels": {"platform": "ios"}})
    view = await get_task(nc, subject_prefix, task_id)
    assert view["status"] == "queued"
    assert view["pending_reason"]
    assert view["pending_reason"].startswith("no_matching_device")

    host = make_host()
    await host.register(("d-ios", {"platform": "ios"}))
    first = await host.next_assignment()
    waiting = await submit(nc, subject_prefix, selector={"labels": {"platform": "ios"}})
    view = await get_task(nc, subject_prefix, waiting)
    assert view["pending_reason"].startswith("devices_busy"), view["pending_reason"]
    await host.claim(first)
    await host.report(first)
    second = await host.next_assignment()
    assert second.task_id == waiting


async def test_assignment_and_event_messages_are_published_once(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1", "d2")
    ids = [await submit(nc, subject_prefix) for _ in range(4)]
    got = await host.assignments(2)
    for a in got:
        await host.claim(a)
        await host.report(a)
    got += await host.assignments(2)
    assert sorted(a.task_id for a in got) == sorted(ids)
    assert await host.no_assignment(0.3)

    async def relayed() -> bool:
        return await scheduler_unsent(scheduler) == 0

    await eventually(relayed, message="outbox empty")
    msgs = await stream_messages(host.js, Subjects(subject_prefix).events_stream)
    msg_ids = [m.headers["Nats-Msg-Id"] for m in msgs if m.headers]
    assert len(msg_ids) == len(set(msg_ids)) == len(msgs)
    kinds = sorted(json.loads(m.data)["event"] for m in msgs)
    assert kinds.count("submitted") == 4
    assert kinds.count("assigned") == 4
    assert kinds.count("done") == 2


async def scheduler_unsent(scheduler: Scheduler) -> int:
    from devsched.store import Store

    store = Store.connect(scheduler.settings.database_url)
    try:
        return await store.unsent_count()
    finally:
        await store.close()


async def test_nudge_is_published_after_a_recorded_cancellation(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1")
    nudges: asyncio.Queue[dict[str, object]] = asyncio.Queue()

    async def on_nudge(msg: object) -> None:
        await nudges.put(json.loads(msg.data))  # type: ignore[attr-defined]

    sub = await nc.subscribe(host.subject("nudge"), cb=on_nudge)
    try:
        task_id = await submit(nc, subject_prefix)
        a = await host.next_assignment()
        await host.claim(a)
        reply = await call(nc, api(subject_prefix, "tasks.cancel"), {"task_id": task_id, "reason": "stop it"})
        assert reply == {"task_id": task_id, "status": "dispatched", "cancel_requested": True}
        nudge = await asyncio.wait_for(nudges.get(), timeout=5)
        assert nudge == {"task_id": task_id, "attempt": 1}
    finally:
        await sub.unsubscribe()


async def test_silent_host_gets_no_new_work_until_it_speaks_again(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, make_host: Callable[..., TestHost]
) -> None:
    settings = scheduler_settings(database_url, nats_url, subject_prefix, heartbeat_interval_s=0.5)
    try:
        async with running_scheduler(settings):
            host = make_host()
            assert await host.register("d1") == {
                "heartbeat_interval_s": 0.5,
                "claim_progress": True,
                "take_next": True,
                "renewals": True,
                "reports": True,
            }
            await asyncio.sleep(1.7)  # 3 intervals and the store's 1 s liveness granularity
            task_id = await submit(nc, subject_prefix)
            view = await get_task(nc, subject_prefix, task_id)
            assert view["pending_reason"].startswith("no_online_device"), view["pending_reason"]
            listed = await call(nc, api(subject_prefix, "hosts.list"), {})
            assert listed["hosts"][0]["online"] is False
            assert listed["hosts"][0]["devices"][0]["state"] == "offline"
            assert await host.no_assignment(0.5)
            await host.request("heartbeat", {})
            assert (await host.next_assignment()).task_id == task_id
    finally:
        await delete_streams(nc, subject_prefix)


async def test_device_waits_out_its_post_expiry_grace(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, make_host: Callable[..., TestHost]
) -> None:
    settings = scheduler_settings(database_url, nats_url, subject_prefix, device_grace_s=1.5)
    sweeper = SweeperSettings(
        database_url=database_url,
        nats_url=nats_url,
        subject_prefix=subject_prefix,
        sweep_interval_s=0.1,
        device_grace_s=1.5,
    )
    try:
        async with running_scheduler(settings), running_sweeper(sweeper):
            host = make_host()
            await host.register("d1")
            task_id = await submit(nc, subject_prefix, lease_ttl_s=2, max_attempts=2)
            first = await host.next_assignment()
            await host.claim(first)
            view = await status_of(nc, subject_prefix, task_id, "queued")
            assert view["pending_reason"].startswith("device_grace"), view["pending_reason"]
            requeued_at = time.monotonic()
            second = await host.next_assignment()
            assert second.body["attempt"] == 2
            assert time.monotonic() - requeued_at > 1.0  # not before the grace (1.5 s from the sweep) ran out
    finally:
        await delete_streams(nc, subject_prefix)
