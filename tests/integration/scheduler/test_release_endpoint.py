"""`P.host.<id>.release` and `P.api.hosts.drain` over NATS with raw JSON, as an agent or operator sends them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from devsched.scheduler.app import Scheduler
from support.polling import eventually
from support.scheduler_harness import (
    ErrorReply,
    TestHost,
    api,
    call,
    check,
    get_task,
    raw_request,
    status_of,
    submit,
    task_events,
)

pytestmark = pytest.mark.integration

RESULT = {"steps": [{"name": "run", "status": "interrupted", "output_tail": "agent shutting down"}]}


async def error_of(nc: NatsClient, subject: str, body: dict[str, Any]) -> ErrorReply:
    with pytest.raises(ErrorReply) as caught:
        check(await raw_request(nc, subject, json.dumps(body).encode()))
    return caught.value


async def test_release_requeues_at_once_on_the_same_device_without_spending_an_attempt(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1")
    task_id = await submit(nc, subject_prefix, max_attempts=1, lease_ttl_s=60)
    first = await host.next_assignment()
    await host.claim(first)
    reply = await host.release(first, reason="agent shutting down", result=RESULT)
    assert {k: reply[k] for k in ("task_id", "attempt", "status", "duplicate")} == {
        "task_id": task_id,
        "attempt": 1,
        "status": "queued",
        "duplicate": False,
    }
    assert reply["recorded_at"].endswith("Z")
    # the device is free at once (no post-expiry grace) and the assignment loop was woken
    second = await host.next_assignment(timeout=5)
    assert (second.task_id, second.body["attempt"]) == (task_id, 2)
    await host.claim(second)
    await host.report(second)
    view = await status_of(nc, subject_prefix, task_id, "done")
    assert (view["attempt_count"], view["max_attempts"], view["releases"]) == (2, 1, 1)
    released = view["attempts"][0]
    assert (released["status"], released["end_reason"], released["report_reason"]) == (
        "released",
        "released",
        "agent shutting down",
    )
    assert released["result"]["steps"][0]["status"] == "interrupted"

    async def requeued() -> list[dict[str, Any]] | None:
        events = await task_events(host.js, subject_prefix, task_id)
        return events if events and events[-1]["event"] == "done" else None

    events = await eventually(requeued, timeout=10, message="the task's events up to done")
    assert [e["event"] for e in events] == [
        "submitted",
        "assigned",
        "dispatched",
        "requeued",
        "assigned",
        "dispatched",
        "done",
    ]
    assert (events[3]["reason"], events[3]["attempt"], events[3]["status"]) == ("released", 1, "queued")


async def test_identical_repeat_is_a_duplicate(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1")
    task_id = await submit(nc, subject_prefix)
    a = await host.next_assignment()
    first = await host.release(a, reason="agent shutting down")
    again = await host.release(a, reason="agent shutting down")
    assert again == {**first, "duplicate": True, "status": again["status"]}
    assert again["status"] in ("queued", "assigned")  # the task may already have been assigned again
    view = await get_task(nc, subject_prefix, task_id)
    assert view["releases"] == 1


async def test_release_with_a_cancellation_pending_ends_cancelled(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1")
    task_id = await submit(nc, subject_prefix)
    a = await host.next_assignment()
    await host.claim(a)
    await call(nc, api(subject_prefix, "tasks.cancel"), {"task_id": task_id, "reason": "enough"})
    assert (await host.release(a))["status"] == "cancelled"
    view = await get_task(nc, subject_prefix, task_id)
    assert (view["status"], view["reason"]) == ("cancelled", "cancelled_after_release")
    assert await host.no_assignment(0.5)


async def test_stale_foreign_and_unknown_releases_are_refused(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    owner, other, stranger = make_host(), make_host(), make_host()
    await owner.register("d1")
    await other.register("d2")
    task_id = await submit(nc, subject_prefix, selector={"device_id": "d1"})
    a = await owner.next_assignment()
    await owner.claim(a)
    before = await get_task(nc, subject_prefix, task_id)

    for host, body, status, code in [
        (other, a.lease, 409, "lease_foreign"),
        (owner, {**a.lease, "lease_id": str(uuid.uuid4())}, 409, "lease_superseded"),
        (owner, {**a.lease, "attempt": 2}, 409, "lease_superseded"),
        (owner, {**a.lease, "task_id": str(uuid.uuid4())}, 404, "not_found"),
        (stranger, a.lease, 404, "not_found"),
    ]:
        err = await error_of(nc, host.subject("release"), body)
        assert (err.status, err.code) == (status, code), (host.host_id, body)
    after = await get_task(nc, subject_prefix, task_id)
    assert {k: v for k, v in after.items() if k != "updated_at"} == {
        k: v for k, v in before.items() if k != "updated_at"
    }
    assert after["attempts"][0]["status"] == "active"

    await owner.report(a)
    err = await error_of(nc, owner.subject("release"), a.lease)
    assert (err.status, err.code) == (409, "outcome_conflict")
    err = await error_of(nc, owner.subject("release"), {**a.lease, "reason": 7})
    assert (err.status, err.code) == (400, "invalid_request")


async def test_hosts_drain_drains_every_device_and_tells_the_agent(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host, other = make_host(), make_host()
    await host.register("d1", "d2")
    await other.register("d3")
    notices = await nc.subscribe(host.subject("nudge"))
    foreign = await nc.subscribe(other.subject("nudge"))
    await nc.flush()
    await nc.flush()

    view = await call(nc, api(subject_prefix, "hosts.drain"), {"host_id": host.host_id, "reason": "kernel update"})
    assert view["host_id"] == host.host_id
    assert [(d["device_id"], d["state"], d["drain_reason"]) for d in view["devices"]] == [
        ("d1", "drained", "kernel update"),
        ("d2", "drained", "kernel update"),
    ]
    notice = await notices.next_msg(timeout=5)
    assert json.loads(notice.data) == {"drain": True, "reason": "kernel update"}
    with pytest.raises(TimeoutError):
        await foreign.next_msg(timeout=0.3)

    task_id = await submit(nc, subject_prefix, selector={"device_id": "d1"})
    assert await host.no_assignment(0.5)
    back = await call(nc, api(subject_prefix, "hosts.drain"), {"host_id": host.host_id, "drained": False})
    assert {d["device_id"]: d["drained"] for d in back["devices"]} == {"d1": False, "d2": False}
    assert (await host.next_assignment()).task_id == task_id
    with pytest.raises(TimeoutError):  # returning to service tells the agent nothing
        await notices.next_msg(timeout=0.3)

    err = await error_of(nc, api(subject_prefix, "hosts.drain"), {"host_id": "no-such-host"})
    assert (err.status, err.code) == (404, "not_found")
    err = await error_of(nc, api(subject_prefix, "hosts.drain"), {"host_id": "a.b"})
    assert (err.status, err.code) == (400, "invalid_request")
