"""The control plane's side of every scenario of spec/host-agent.md, end to end over NATS.

The agent's own side (stopping at a step boundary, choosing `cancelled` or `failed`) is tested with the
agent; here a test host plays the agent and checks what the control plane answers it.
"""

from __future__ import annotations

import uuid

import pytest
from nats.aio.client import Client as NatsClient

from support.polling import eventually
from support.scheduler_harness import ErrorReply, Lab, api, call, get_task, status_of, task_events

pytestmark = pytest.mark.e2e


async def refused(coro: object) -> ErrorReply:
    with pytest.raises(ErrorReply) as caught:
        await coro  # type: ignore[misc]
    assert caught.value.status == 409
    return caught.value


# -- Requirement: Active execution renews its lease ---------------------------------------------------


async def test_lease_renewal_succeeds_over_nats(lab: Lab, nc: NatsClient) -> None:
    host = await lab.host("d1")
    task_id = await lab.submit(lease_ttl_s=5)
    a = await host.next_assignment()
    claimed = await host.claim(a)
    renewed = await host.renew(a, {"step": "run", "index": 0, "of": 1})
    assert renewed["expires_at"] > claimed["expires_at"]
    assert renewed["ttl_s"] == 5
    view = await get_task(nc, lab.prefix, task_id)
    (attempt,) = view["attempts"]
    assert (attempt["attempt"], attempt["lease_id"], attempt["device_id"]) == (1, a.body["lease_id"], lab.device("d1"))
    assert attempt["expires_at"] == renewed["expires_at"]
    assert view["attempt_count"] == 1


async def test_lease_is_stale_or_foreign_over_nats(lab: Lab, nc: NatsClient) -> None:
    host, stranger = await lab.host("d1"), await lab.host("d2")
    await call(nc, api(lab.prefix, "devices.drain"), {"device_id": lab.device("d2")})
    task_id = await lab.submit(lease_ttl_s=2, max_attempts=3)
    first = await host.next_assignment()
    await host.claim(first)

    # Differently owned: refused, and the owner's lease is untouched.
    before = await get_task(nc, lab.prefix, task_id)
    assert (await refused(stranger.renew(first))).code == "lease_foreign"
    assert (await get_task(nc, lab.prefix, task_id))["attempts"] == before["attempts"]

    # Expired: the device is drained so that the requeued task waits, and the attempt stays current.
    await call(nc, api(lab.prefix, "devices.drain"), {"device_id": lab.device("d1")})
    await status_of(nc, lab.prefix, task_id, "queued")
    assert (await refused(host.renew(first))).code == "lease_expired"
    view = await get_task(nc, lab.prefix, task_id)
    assert view["status"] == "queued"  # not revived
    assert view["attempts"][0]["status"] == "expired"

    # Replaced: a newer attempt exists.
    await call(nc, api(lab.prefix, "devices.drain"), {"device_id": lab.device("d1"), "drained": False})
    second = await host.next_assignment()
    await host.claim(second)
    current = (await get_task(nc, lab.prefix, task_id))["attempts"][1]
    assert (await refused(host.renew(first))).code == "lease_superseded"
    assert (await refused(host.request("renew", {**second.lease, "lease_id": str(uuid.uuid4())}))).code == (
        "lease_superseded"
    )
    after = await get_task(nc, lab.prefix, task_id)
    assert after["attempts"][1] == current  # the current attempt is not altered
    assert after["status"] == "dispatched"


async def test_renewal_response_signals_a_pending_cancellation_over_nats(lab: Lab, nc: NatsClient) -> None:
    host = await lab.host("d1")
    task_id = await lab.submit()
    a = await host.next_assignment()
    await host.claim(a)
    assert (await host.renew(a))["cancel_requested"] is False
    await call(nc, api(lab.prefix, "tasks.cancel"), {"task_id": task_id})
    assert (await host.renew(a, {"step": "run", "index": 0, "of": 1}))["cancel_requested"] is True
    assert (await host.claim(a))["cancel_requested"] is True  # a repeated claim answers as a renewal


# -- Requirement: Terminal result reporting is idempotent ----------------------------------------------


async def test_report_a_successful_result_over_nats(lab: Lab, nc: NatsClient) -> None:
    host = await lab.host("d1")
    task_id = await lab.submit()
    a = await host.next_assignment()
    await host.claim(a)
    result = {"steps": [{"name": "run", "status": "done", "exit_code": 0, "output_tail": "ok\n"}]}
    reply = await host.report(a, "done", result=result)
    assert reply["status"] == "done"
    view = await get_task(nc, lab.prefix, task_id)
    assert view["status"] == "done"
    assert view["result"]["steps"][0]["output_tail"] == "ok\n"
    assert view["attempts"][0]["end_reason"] == "done"
    assert (await lab.submit()) == (await host.next_assignment()).task_id  # reservation released


async def test_report_a_cancelled_result_over_nats(lab: Lab, nc: NatsClient) -> None:
    host = await lab.host("d1")
    task_id = await lab.submit()
    a = await host.next_assignment()
    await host.claim(a)
    await call(nc, api(lab.prefix, "tasks.cancel"), {"task_id": task_id, "reason": "operator"})
    result = {"steps": [{"name": "run", "status": "interrupted"}]}
    reply = await host.report(a, "cancelled", reason="stopped on cancellation", result=result)
    assert reply["status"] == "cancelled"
    view = await get_task(nc, lab.prefix, task_id)
    assert (view["status"], view["reason"], view["cancel_requested"]) == ("cancelled", "stopped on cancellation", False)
    assert view["result"]["steps"][0]["status"] == "interrupted"
    assert view["attempts"][0]["end_reason"] == "cancelled"
    assert (await lab.submit()) == (await host.next_assignment()).task_id  # reservation released


async def test_retry_a_result_after_response_loss_over_nats(lab: Lab, nc: NatsClient) -> None:
    host = await lab.host("d1")
    task_id = await lab.submit()
    a = await host.next_assignment()
    await host.claim(a)
    first = await host.report(a, "done")
    again = await host.report(a, "done", reason="a different text", result={"steps": []})
    assert again == {**first, "duplicate": True}
    view = await get_task(nc, lab.prefix, task_id)
    assert (view["status"], view["attempt_count"], view["reason"]) == ("done", 1, None)  # the first report stands
    assert len(view["attempts"]) == 1

    async def one_done() -> bool:
        return [e["event"] for e in await task_events(host.js, lab.prefix, task_id)].count("done") == 1

    await eventually(one_done, message="exactly one done event")


async def test_stale_attempt_reports_after_requeue_over_nats(lab: Lab, nc: NatsClient) -> None:
    host = await lab.host("d1")
    task_id = await lab.submit(lease_ttl_s=2, max_attempts=2)
    stale = await host.next_assignment()
    await host.claim(stale)
    newer = await host.next_assignment(timeout=10)
    renewed = await host.claim(newer)
    assert (await refused(host.report(stale, "done"))).code == "lease_superseded"
    assert (await refused(host.report(stale, "failed"))).code == "lease_superseded"
    view = await get_task(nc, lab.prefix, task_id)
    assert view["status"] == "dispatched"
    assert (view["attempts"][1]["status"], view["attempts"][1]["expires_at"]) == ("active", renewed["expires_at"])


# -- Requirement: Host distinguishes cancellation stop from lease-loss stop -----------------------------


async def test_stop_triggered_by_cancellation_over_nats(lab: Lab, nc: NatsClient) -> None:
    host = await lab.host("d1")
    task_id = await lab.submit()
    a = await host.next_assignment()
    await host.claim(a)
    await call(nc, api(lab.prefix, "tasks.cancel"), {"task_id": task_id})
    assert (await host.renew(a))["cancel_requested"] is True  # the stop signal
    assert (await host.report(a, "cancelled"))["status"] == "cancelled"


async def test_stop_triggered_by_lease_loss_over_nats(lab: Lab, nc: NatsClient) -> None:
    host = await lab.host("d1")
    task_id = await lab.submit(lease_ttl_s=2, max_attempts=1)
    a = await host.next_assignment()
    await host.claim(a)
    # Without a cancellation request, `cancelled` is refused whatever the state of the lease...
    assert (await refused(host.report(a, "cancelled"))).code == "cancel_not_requested"
    view = await status_of(nc, lab.prefix, task_id, "failed")  # ...and the lost lease ends the task as failed
    assert view["reason"] == "lease_expired"
    assert (await refused(host.report(a, "failed"))).code == "task_terminal"
    assert (await get_task(nc, lab.prefix, task_id))["status"] == "failed"
