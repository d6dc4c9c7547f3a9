"""A report's optional `take_next` over NATS: advertised in the register and heartbeat replies, answered with
the device's next attempt already dispatched (no assignment message for it), the same again for a repeat,
and a report without it (an older agent's) hands over through JetStream as before."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from devsched.scheduler.app import Scheduler
from support.polling import eventually
from support.scheduler_harness import TestHost, done_result, get_task, plan, submit, task_events

pytestmark = pytest.mark.integration


async def _relayed(host: TestHost, prefix: str, task_id: str, count: int) -> list[dict[str, object]]:
    async def enough() -> list[dict[str, object]] | None:
        events = await task_events(host.js, prefix, task_id)
        return events if len(events) >= count else None

    found = await eventually(enough, message=f"{count} events of {task_id} relayed")
    assert isinstance(found, list)
    return found


def _lease(handed: dict[str, Any]) -> dict[str, Any]:
    return {"task_id": handed["task_id"], "attempt": handed["attempt"], "lease_id": handed["lease_id"]}


async def test_register_and_heartbeat_say_a_report_may_take_the_next_attempt(
    scheduler: Scheduler, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    assert (await host.register("d1"))["take_next"] is True
    assert (await host.request("heartbeat", {}))["take_next"] is True


async def test_a_report_taking_next_gets_the_next_attempt_dispatched_in_its_reply(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1")
    body = plan("flash", "test")
    first = await submit(nc, subject_prefix, plan=body)
    a = await host.next_assignment()
    await host.claim(a)
    second = await submit(nc, subject_prefix, plan=body)
    report = {**a.lease, "outcome": "done", "result": done_result(body), "take_next": True}
    reply = await host.request("report", report)
    handed = reply["next"]
    assert (handed["task_id"], handed["attempt"], handed["device_id"]) == (second, 1, "d1")
    assert [s["name"] for s in handed["plan"]["steps"]] == ["flash", "test"]
    assert (handed["ttl_s"], handed["cancel_requested"]) == (30, False)
    assert "stop" not in handed
    view = await get_task(nc, subject_prefix, second)
    assert view["status"] == "dispatched"
    assert view["attempts"][0]["lease_id"] == handed["lease_id"]
    assert view["attempts"][0]["progress"] == {"step": "flash", "index": 0, "of": 2}

    repeat = await host.request("report", report)  # the first reply was lost: the agent sends the same bytes
    assert repeat["duplicate"] is True
    again = repeat["next"]
    assert {k: v for k, v in again.items() if k != "ttl_s"} == {k: v for k, v in handed.items() if k != "ttl_s"}
    assert 1 <= again["ttl_s"] <= handed["ttl_s"], "what is left of the lease"

    assert await host.no_assignment(1.0), "nothing comes through JetStream for an attempt handed over"
    await host.request("renew", _lease(handed))
    done = await host.request(
        "report", {**_lease(handed), "outcome": "done", "result": done_result(body), "take_next": True}
    )
    assert "next" not in done, "nothing queued: nothing handed"
    events = await _relayed(host, subject_prefix, second, 5)
    assert [(e["event"], e["seq"]) for e in events] == [
        ("submitted", 1),
        ("assigned", 2),
        ("dispatched", 3),
        ("progress", 4),
        ("done", 5),
    ]
    assert (await get_task(nc, subject_prefix, first))["status"] == "done"


async def test_a_report_without_take_next_hands_over_through_jetstream(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1")
    body = plan("flash")
    await submit(nc, subject_prefix, plan=body)
    a = await host.next_assignment()
    await host.claim(a)
    second = await submit(nc, subject_prefix, plan=body)
    reply = await host.report(a, "done")  # the report of an older agent
    assert "next" not in reply
    b = await host.next_assignment()
    assert b.task_id == second
    assert (await get_task(nc, subject_prefix, second))["status"] == "assigned"
