"""Every scenario of spec/scheduler-repository.md, end to end over NATS, services as processes."""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from support.polling import eventually
from support.scheduler_harness import (
    ControlPlane,
    ErrorReply,
    Lab,
    api,
    call,
    device_state,
    get_task,
    status_of,
    task_events,
)

pytestmark = pytest.mark.e2e


async def events_of(lab: Lab, task_id: str) -> list[str]:
    return [e["event"] for e in await task_events(lab.hosts[0].js, lab.prefix, task_id)]


# -- Requirement: Terminal transitions validate the active lease -------------------------------------------


async def test_active_lease_reports_completion_over_nats(lab: Lab, nc: NatsClient, control_plane: ControlPlane) -> None:
    host = await lab.host("d1")
    task_id = await lab.submit()
    a = await host.next_assignment()
    await host.claim(a)
    reply = await host.report(a, "done")
    assert reply["status"] == "done"
    assert reply["duplicate"] is False
    view = await get_task(nc, lab.prefix, task_id)
    assert view["status"] == "done"
    assert view["attempt_count"] == 1
    assert await device_state(nc, lab.prefix, lab.device("d1")) == "available"  # reservation released
    second = await lab.submit()
    assert (await host.next_assignment()).task_id == second  # and the device takes new work
    await eventually(lambda: _has(events_of(lab, task_id), "done"), message="done event")
    assert (await events_of(lab, task_id)).count("done") == 1  # transitioned once


async def _has(events: Any, kind: str) -> bool:
    return kind in await events


async def test_superseded_lease_reports_completion_over_nats(lab: Lab, nc: NatsClient) -> None:
    host = await lab.host("d1")
    task_id = await lab.submit(lease_ttl_s=2, max_attempts=2)
    first = await host.next_assignment()
    await host.claim(first)
    second = await host.next_assignment(timeout=10)  # the sweeper expired the first lease; a retry was assigned
    assert second.task_id == task_id
    assert second.body["attempt"] == 2
    await host.claim(second)
    with pytest.raises(ErrorReply) as caught:
        await host.report(first, "done")
    assert (caught.value.status, caught.value.code) == (409, "lease_superseded")
    view = await get_task(nc, lab.prefix, task_id)
    assert view["status"] == "dispatched"
    assert view["attempt_count"] == 2
    assert [a["status"] for a in view["attempts"]] == ["expired", "active"]
    assert view["result"] is None
    await host.report(second, "done")
    assert (await get_task(nc, lab.prefix, task_id))["status"] == "done"


# -- Requirement: Expired attempts follow bounded retry policy ---------------------------------------------


async def test_lease_expires_with_attempts_remaining_over_nats(lab: Lab, nc: NatsClient) -> None:
    host = await lab.host("d1")
    task_id = await lab.submit(lease_ttl_s=2, max_attempts=3)
    first = await host.next_assignment()
    await host.claim(first)
    retry = await host.next_assignment(timeout=10)  # requeued, and the released device was reserved again
    assert retry.body["attempt"] == 2
    assert retry.body["device_id"] == lab.device("d1")
    view = await get_task(nc, lab.prefix, task_id)
    expired = view["attempts"][0]
    assert (expired["status"], expired["end_reason"]) == ("expired", "lease_expired")
    assert expired["ended_at"] is not None
    assert expired["lease_id"] == first.body["lease_id"]
    await eventually(lambda: _has(events_of(lab, task_id), "requeued"), message="requeued event")
    events = await task_events(host.js, lab.prefix, task_id)
    requeued = next(e for e in events if e["event"] == "requeued")
    assert requeued["status"] == "queued"
    assert requeued["attempt"] == 1


async def test_lease_expires_at_attempt_limit_over_nats(lab: Lab, nc: NatsClient) -> None:
    host = await lab.host("d1")
    task_id = await lab.submit(lease_ttl_s=2, max_attempts=1)
    a = await host.next_assignment()
    await host.claim(a)
    view = await status_of(nc, lab.prefix, task_id, "failed")
    assert view["reason"] == "lease_expired"
    assert view["attempts"][0]["end_reason"] == "lease_expired"
    assert view["attempt_count"] == 1
    assert await device_state(nc, lab.prefix, lab.device("d1")) == "available"


async def test_lease_expires_with_a_cancellation_pending_over_nats(lab: Lab, nc: NatsClient) -> None:
    host = await lab.host("d1")
    task_id = await lab.submit(lease_ttl_s=2, max_attempts=3)
    a = await host.next_assignment()
    await host.claim(a)
    cancel = await call(nc, api(lab.prefix, "tasks.cancel"), {"task_id": task_id, "reason": "operator"})
    assert cancel["cancel_requested"] is True
    view = await status_of(nc, lab.prefix, task_id, "cancelled")
    assert view["reason"] == "cancelled_after_lease_expired"
    assert view["attempt_count"] == 1
    assert view["attempts"][0]["status"] == "expired"
    assert await device_state(nc, lab.prefix, lab.device("d1")) == "available"
    assert await host.no_assignment(0.5)


# -- Requirement: Task status includes a reachable cancelled value --------------------------------------


async def test_cancelled_status_is_a_valid_terminal_state_over_nats(lab: Lab, nc: NatsClient) -> None:
    queued = await lab.submit()  # no device yet: cancelled at once
    assert (await call(nc, api(lab.prefix, "tasks.cancel"), {"task_id": queued}))["status"] == "cancelled"

    host = await lab.host("d1")
    task_id = await lab.submit()
    a = await host.next_assignment()
    await host.claim(a)
    await call(nc, api(lab.prefix, "tasks.cancel"), {"task_id": task_id})
    assert (await host.renew(a))["cancel_requested"] is True
    assert (await host.report(a, "cancelled"))["status"] == "cancelled"
    for verb, body in (("claim", a.lease), ("renew", a.lease)):
        with pytest.raises(ErrorReply) as caught:
            await host.request(verb, body)
        assert caught.value.code == "task_terminal"
    for tid in (queued, task_id):
        assert (await get_task(nc, lab.prefix, tid))["status"] == "cancelled"
    assert await host.no_assignment(0.5)  # no further assignment


# -- Requirement: Lease renewal surfaces a pending cancellation request ------------------------------


async def test_renewal_on_a_task_with_a_pending_cancellation_over_nats(lab: Lab, nc: NatsClient) -> None:
    host = await lab.host("d1")
    task_id = await lab.submit(lease_ttl_s=30)
    a = await host.next_assignment()
    claimed = await host.claim(a)
    await call(nc, api(lab.prefix, "tasks.cancel"), {"task_id": task_id})
    renewed = await host.renew(a)
    assert renewed["cancel_requested"] is True
    assert renewed["ttl_s"] == 30
    assert renewed["expires_at"] >= claimed["expires_at"]  # extended normally
    view = await get_task(nc, lab.prefix, task_id)
    assert view["status"] == "dispatched"
    assert view["cancel_requested"] is True
    assert view["attempts"][0]["expires_at"] == renewed["expires_at"]


async def test_renewal_on_a_task_without_a_pending_cancellation_over_nats(lab: Lab, nc: NatsClient) -> None:
    host = await lab.host("d1")
    task_id = await lab.submit(lease_ttl_s=30)
    a = await host.next_assignment()
    claimed = await host.claim(a)
    renewed = await host.renew(a)
    assert renewed["cancel_requested"] is False
    assert renewed["expires_at"] >= claimed["expires_at"]
    assert (await get_task(nc, lab.prefix, task_id))["cancel_requested"] is False


async def test_service_logs_are_json_lines_with_task_attempt_and_lease_ids(
    lab: Lab, control_plane: ControlPlane
) -> None:
    host = await lab.host("d1")
    task_id = await lab.submit()
    a = await host.next_assignment()
    await host.claim(a)
    await host.report(a)

    def reported() -> dict[str, Any] | None:
        return next(
            (
                line
                for line in control_plane.scheduler.log_lines()
                if line.get("msg") == "reported" and line.get("task_id") == task_id
            ),
            None,
        )

    line = await eventually(reported, message="report logged")
    assert line is not None
    assert line["attempt"] == 1
    assert line["lease_id"] == a.body["lease_id"]
    assert line["host_id"] == host.host_id
    assert line["service"] == "devsched-scheduler"
    assert line["level"] == "info"
    assert line["ts"].endswith("Z")
