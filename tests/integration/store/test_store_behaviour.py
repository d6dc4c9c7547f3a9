"""Assignment policy, hosts and devices, listings, and the outbox."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from sqlalchemy import text

from devsched.core.errors import DeviceConflict
from devsched.core.events import AttemptAssigned, StepProgress, TaskEvent
from devsched.core.status import DeviceState, EventKind, Outcome, TaskStatus
from devsched.protocol.subjects import Subjects
from devsched.scheduler.outgoing import outgoing
from devsched.store import DeviceSpec, NewTask, OutboxMessage, Published
from support.store_lab import Lab, ref

pytestmark = pytest.mark.integration


async def test_priority_then_age_decides_who_runs_first(lab: Lab) -> None:
    low = await lab.submit(priority=-5)
    old = await lab.submit(priority=10)
    lab.clock.advance(0.001)  # the manual clock only moves when told: make "older" real
    new = await lab.submit(priority=10)
    await lab.host("h1", "d1")
    order = []
    for _ in range(3):
        (m,) = await lab.store.assign()
        order.append(m.task_id)
        await lab.store.report(ref(m), Outcome.DONE)
    assert order == [old, new, low]


async def test_requeued_task_keeps_its_place_by_submit_time(lab: Lab) -> None:
    await lab.host("h1", "d1")
    first = await lab.running()
    lab.clock.advance(1)
    second = await lab.submit()
    await lab.expire(first)
    lab.clock.advance(31)
    await lab.alive()
    (m,) = await lab.store.assign()
    assert m.task_id == first.task_id
    assert second != first.task_id


async def test_selector_labels_and_device_id(lab: Lab) -> None:
    await lab.store.register_host(
        "h1", [DeviceSpec("pixel", {"platform": "android", "model": "p7"}), DeviceSpec("iphone", {"platform": "ios"})]
    )
    ios = await lab.submit(labels={"platform": "ios"})
    named = await lab.submit(device_id="pixel")
    nothing = await lab.submit(labels={"platform": "android", "model": "s23"})
    got = {m.task_id: m.device_id for m in await lab.store.assign()}
    assert got == {ios: "iphone", named: "pixel"}
    view = await lab.store.get_task(nothing)
    assert view.status is TaskStatus.QUEUED
    assert view.pending_reason is not None
    assert view.pending_reason.startswith("no_matching_device")


async def test_unmatchable_head_of_queue_does_not_block_others(lab: Lab) -> None:
    await lab.host("h1", "d1")
    for _ in range(5):
        await lab.submit(priority=100, labels={"platform": "ios"})
    runnable = await lab.submit(priority=0)
    assert [m.task_id for m in await lab.store.assign(limit=2)] == [runnable]


async def test_offline_hosts_get_no_new_work(lab: Lab) -> None:
    await lab.host("h1", "d1")
    task = await lab.submit()
    lab.clock.advance(15)  # three 5 s heartbeat intervals missed
    assert await lab.store.assign() == []
    view = await lab.store.get_task(task)
    assert view.pending_reason is not None
    assert view.pending_reason.startswith("no_online_device")
    (host,) = await lab.store.list_hosts()
    assert not host.online
    assert host.devices[0].state is DeviceState.OFFLINE
    await lab.store.heartbeat("h1")
    assert [m.task_id for m in await lab.store.assign()] == [task]


async def test_busy_and_drained_devices_explain_the_wait(lab: Lab) -> None:
    await lab.host("h1", "d1")
    await lab.running()
    waiting = await lab.submit()
    reason = (await lab.store.get_task(waiting)).pending_reason
    assert reason is not None
    assert reason.startswith("devices_busy")
    drained = await lab.store.drain_device("d1", True, "flaky USB hub")
    assert drained.state is DeviceState.DRAINED
    assert drained.drain_reason == "flaky USB hub"
    reason = (await lab.store.get_task(waiting)).pending_reason
    assert reason is not None
    assert reason.startswith("devices_drained")


async def test_drained_device_gets_no_work_and_survives_reregistration(lab: Lab) -> None:
    await lab.host("h1", "d1")
    await lab.store.drain_device("d1", True, "maintenance")
    await lab.host("h1", "d1")
    task = await lab.submit()
    assert await lab.store.assign() == []
    await lab.store.drain_device("d1", False)
    assert [m.task_id for m in await lab.store.assign()] == [task]


async def test_expired_device_waits_out_its_grace_but_reported_device_is_free_at_once(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(lease_ttl_s=20)
    await lab.expire(lease, ttl=20)  # requeued; d1 in grace for one ttl
    assert await lab.store.assign() == []
    reason = (await lab.store.get_task(lease.task_id)).pending_reason
    assert reason is not None
    assert reason.startswith("device_grace")
    lab.clock.advance(19)
    await lab.alive()
    assert await lab.store.assign() == []
    lab.clock.advance(1)
    await lab.alive()
    (m,) = await lab.store.assign()
    await lab.store.report(ref(m), Outcome.DONE)
    nxt = await lab.submit()
    assert [x.task_id for x in await lab.store.assign()] == [nxt]


async def test_reregistration_drops_devices_but_running_work_keeps_them(lab: Lab) -> None:
    await lab.host("h1", "d1", "d2")
    lease = await lab.running(device_id="d1")
    await lab.host("h1", "d2")  # d1 dropped while it runs an attempt
    (host,) = await lab.store.list_hosts()
    assert {d.device_id for d in host.devices} == {"d1", "d2"}
    await lab.store.renew(lease)
    await lab.submit(device_id="d1")
    await lab.store.report(lease, Outcome.DONE)
    assert await lab.store.assign() == [], "a dropped device gets no new work"
    (host,) = await lab.store.list_hosts()
    assert {d.device_id for d in host.devices} == {"d2"}, "and leaves once idle"
    with pytest.raises(DeviceConflict):  # it is still h1's, until an operator frees it
        await lab.store.register_host("h2", [DeviceSpec("d1")])
    await lab.store.forget_device("d1", "moved")
    await lab.store.register_host("h2", [DeviceSpec("d1")])  # another host may now take it


async def test_listing_pages_newest_first(lab: Lab) -> None:
    ids = []
    for _ in range(7):
        ids.append(await lab.submit())
        lab.clock.advance(1)
    await lab.store.request_cancel(ids[0])
    seen, after = [], None
    while True:
        page = await lab.store.list_tasks(limit=3, after=after)
        seen += [t.task_id for t in page.tasks]
        if page.next is None:
            break
        after = page.next
    assert seen == list(reversed(ids))
    cancelled = await lab.store.list_tasks(status=TaskStatus.CANCELLED)
    assert [t.task_id for t in cancelled.tasks] == [ids[0]]
    assert cancelled.next is None


async def test_repeated_idempotency_key_returns_the_existing_task(lab: Lab) -> None:
    a = await lab.store.submit(NewTask(plan={"steps": []}, idempotency_key="k1"))
    b = await lab.store.submit(NewTask(plan={"steps": [{"name": "other"}]}, idempotency_key="k1"))
    assert a.created
    assert not b.created
    assert a.task_id == b.task_id


async def test_events_are_numbered_in_commit_order(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running()
    await lab.store.renew(lease, {"step": "flash", "index": 0, "of": 1})
    await lab.store.renew(lease, {"step": "flash", "index": 0, "of": 1})  # same step: no second event
    await lab.store.request_cancel(lease.task_id, reason="enough")
    await lab.store.request_cancel(lease.task_id, reason="again")  # repeating emits nothing
    await lab.store.report(lease, Outcome.CANCELLED)
    published: list[OutboxMessage] = []

    async def publish(batch: Sequence[OutboxMessage]) -> Published:
        published.extend(batch)
        return Published([m.id for m in batch])

    assert await lab.store.relay_outbox(publish) == len(published)
    events = [m.event for m in published if isinstance(m.event, TaskEvent)]
    assert [e.event for e in events] == [
        EventKind.SUBMITTED,
        EventKind.ASSIGNED,
        EventKind.DISPATCHED,
        EventKind.PROGRESS,
        EventKind.CANCEL_REQUESTED,
        EventKind.CANCELLED,
    ]
    assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6]
    assert events[3].progress == StepProgress(step="flash", index=0, of=1)
    assert events[4].reason == "enough"
    (assignment,) = [m.event for m in published if isinstance(m.event, AttemptAssigned)]
    assert (assignment.task_id, assignment.attempt, assignment.host_id) == (lease.task_id, 1, "h1")
    assert assignment.lease_id == lease.lease_id
    # what the relay makes of it: the protocol's subject and message id
    wire = outgoing(assignment, Subjects())
    assert wire.subject == "devsched.assign.h1"
    assert wire.msg_id == f"{lease.task_id}.1"
    assert await lab.store.unsent_count() == 0


async def test_relay_stops_at_a_failed_publish_and_keeps_the_rest(lab: Lab) -> None:
    for _ in range(5):
        await lab.submit()
    calls: list[int] = []

    async def flaky(batch: Sequence[OutboxMessage]) -> Published:
        sent: list[int] = []
        for m in batch:
            calls.append(m.id)
            if len(calls) == 3:
                return Published(sent, ConnectionError("nats went away"))
            sent.append(m.id)
        return Published(sent)

    with pytest.raises(ConnectionError):
        await lab.store.relay_outbox(flaky)
    assert await lab.store.unsent_count() == 3, "two published and marked; the failed one and the rest wait"
    retried: list[int] = []

    async def ok(batch: Sequence[OutboxMessage]) -> Published:
        retried.extend(m.id for m in batch)
        return Published(retried)

    assert await lab.store.relay_outbox(ok) == 3
    assert retried[0] == calls[2], "the failed message goes first on the next pass, in order"
    async with lab.store.engine.connect() as conn:
        unsent = (await conn.execute(text("SELECT count(*) FROM outbox_unsent"))).scalar_one()
    assert unsent == 0


async def test_relay_marks_exactly_the_acknowledged_messages_in_any_order(lab: Lab) -> None:
    """A publisher with several messages in flight acknowledges some, in any order: only those are marked."""
    for _ in range(4):
        await lab.submit()
    first: list[int] = []

    async def some(batch: Sequence[OutboxMessage]) -> Published:
        first.extend(m.id for m in batch)
        return Published([first[3], first[1]], TimeoutError("two acks never came"))

    with pytest.raises(TimeoutError):
        await lab.store.relay_outbox(some)
    assert await lab.store.unsent_count() == 2
    second: list[int] = []

    async def rest(batch: Sequence[OutboxMessage]) -> Published:
        second.extend(m.id for m in batch)
        return Published(second)

    assert await lab.store.relay_outbox(rest) == 2
    assert second == [first[0], first[2]], "the unacknowledged ones, still in id order"


async def test_relay_refuses_an_acknowledgement_of_a_message_it_did_not_hand_out(lab: Lab) -> None:
    await lab.submit()

    async def confused(batch: Sequence[OutboxMessage]) -> Published:
        return Published([m.id for m in batch] + [10**9])

    with pytest.raises(ValueError, match="not claimed"):
        await lab.store.relay_outbox(confused)
    assert await lab.store.unsent_count() == 1, "nothing marked: the pass rolled back"
