"""Release: a host gives an attempt back; the device is free at once and the task queued again.

Against a real Postgres through the Store: the rule is core's `decide_release` (unit-tested there); this
checks what the database keeps (attempt status and end reason, `releases`, the reservation, the events)
and that a refused release changes nothing.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence

import pytest
from sqlalchemy import text

from devsched.core.errors import (
    LeaseExpired,
    LeaseForeign,
    LeaseSuperseded,
    NotFound,
    OutcomeConflict,
    TaskTerminal,
)
from devsched.core.events import TaskEvent
from devsched.core.status import AttemptStatus, DeviceState, EndReason, EventKind, Outcome, TaskReason, TaskStatus
from devsched.store import ManualClock, OutboxMessage, Published, Store
from support.store_lab import Lab, ref, snapshot

pytestmark = pytest.mark.integration

RESULT = {"steps": [{"name": "flash", "status": "interrupted", "exit_code": None, "output_tail": "stopped"}]}


async def _events(store: Store, task_id: uuid.UUID) -> list[TaskEvent]:
    published: list[OutboxMessage] = []

    async def publish(batch: Sequence[OutboxMessage]) -> Published:
        published.extend(batch)
        return Published([m.id for m in batch])

    await store.relay_outbox(publish, limit=1000)
    return [m.event for m in published if isinstance(m.event, TaskEvent) and m.event.task_id == task_id]


async def test_release_requeues_and_frees_the_device_at_once(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(max_attempts=1, lease_ttl_s=20)
    receipt = await lab.store.release(lease, reason="agent shutting down", result=RESULT)
    assert (receipt.status, receipt.duplicate, receipt.attempt) == (TaskStatus.QUEUED, False, 1)

    view = await lab.store.get_task(lease.task_id)
    assert (view.status, view.attempt_count, view.releases, view.reason) == (TaskStatus.QUEUED, 1, 1, None)
    (first,) = view.attempts
    assert (first.status, first.end_reason) == (AttemptStatus.RELEASED, EndReason.RELEASED)
    assert (first.report_reason, first.result, first.ended_at) == ("agent shutting down", RESULT, receipt.recorded_at)
    assert [d.state for h in await lab.store.list_hosts() for d in h.devices] == [DeviceState.AVAILABLE]

    # no post-expiry grace: the same device takes the task again at once, and a max_attempts=1 task may
    # run a second attempt, numbered 2
    (again,) = await lab.store.assign()
    assert (again.task_id, again.attempt, again.device_id) == (lease.task_id, 2, "d1")
    await lab.store.claim(ref(again))
    await lab.store.report(ref(again), Outcome.DONE)
    done = await lab.store.get_task(lease.task_id)
    assert (done.status, done.attempt_count, done.releases) == (TaskStatus.DONE, 2, 1)
    assert [a.attempt for a in done.attempts] == [1, 2]

    events = await _events(lab.store, lease.task_id)
    requeued = [e for e in events if e.event is EventKind.REQUEUED]
    assert [(e.reason, e.attempt, e.host_id, e.device_id, e.status) for e in requeued] == [
        ("released", 1, "h1", "d1", TaskStatus.QUEUED)
    ]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


async def test_an_assigned_attempt_may_be_released_before_its_claim(lab: Lab) -> None:
    await lab.host("h1", "d1")
    task = await lab.submit()
    lease = await lab.assign_one(task)
    assert (await lab.store.release(lease)).status is TaskStatus.QUEUED
    with pytest.raises(LeaseExpired):  # the message still in the host's consumer is stale now
        await lab.store.claim(lease)


async def test_release_with_a_cancellation_pending_cancels(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running()
    await lab.store.request_cancel(lease.task_id, reason="enough")
    receipt = await lab.store.release(lease, reason="agent shutting down", result=RESULT)
    assert receipt.status is TaskStatus.CANCELLED
    view = await lab.store.get_task(lease.task_id)
    assert (view.status, view.reason, view.result, view.releases) == (
        TaskStatus.CANCELLED,
        TaskReason.CANCELLED_AFTER_RELEASE.value,
        RESULT,
        1,
    )
    assert view.attempts[-1].status is AttemptStatus.RELEASED
    assert await lab.store.assign() == []
    events = await _events(lab.store, lease.task_id)
    assert (events[-1].event, events[-1].reason) == (EventKind.CANCELLED, "cancelled_after_release")


async def test_a_task_released_over_and_over_ends_failed(database_url: str, clock: ManualClock) -> None:
    store = Store.connect(database_url, clock=clock, max_releases=2)
    try:
        lab = Lab(store, clock)
        await lab.host("h1", "d1")
        task = await lab.submit(max_attempts=1)
        statuses = []
        for n in (1, 2, 3):
            lease = await lab.assign_one(task)
            assert lease.attempt == n
            await store.claim(lease)
            statuses.append((await store.release(lease)).status)
        assert statuses == [TaskStatus.QUEUED, TaskStatus.QUEUED, TaskStatus.FAILED]
        view = await store.get_task(task)
        assert (view.status, view.reason, view.attempt_count, view.releases) == (
            TaskStatus.FAILED,
            "released_too_often",
            3,
            3,
        )
        events = await _events(store, task)
        assert (events[-1].event, events[-1].reason) == (EventKind.FAILED, "released_too_often")
        assert await store.assign() == []
    finally:
        await store.close()


async def test_identical_repeat_is_a_duplicate_and_changes_nothing(lab: Lab) -> None:
    await lab.host("h1", "d1")
    await lab.host("h2", "d2")
    lease = await lab.running()
    first = await lab.store.release(lease, reason="agent shutting down", result=RESULT)
    untouched = await snapshot(lab.store)
    lab.clock.advance(5)
    again = await lab.store.release(lease, reason="something else", result=None)
    assert (again.duplicate, again.recorded_at, again.status) == (True, first.recorded_at, TaskStatus.QUEUED)
    assert await snapshot(lab.store) == untouched

    # still a duplicate once the task runs again (the reply of the first may have been lost meanwhile)
    (m,) = await lab.store.assign()
    later = await lab.store.release(lease)
    assert (later.duplicate, later.recorded_at, later.status) == (True, first.recorded_at, TaskStatus.ASSIGNED)
    assert (await lab.store.get_task(lease.task_id)).attempts[-1].status is AttemptStatus.ACTIVE
    assert m.attempt == 2


async def test_stale_or_foreign_release_is_refused_and_changes_nothing(lab: Lab) -> None:
    await lab.host("h1", "d1")
    await lab.host("h2", "d2")
    lease = await lab.running(device_id="d1")
    untouched = await snapshot(lab.store)
    with pytest.raises(LeaseForeign):
        await lab.store.release(dataclasses.replace(lease, host_id="h2"))
    with pytest.raises(LeaseSuperseded):
        await lab.store.release(dataclasses.replace(lease, lease_id=uuid.uuid4()))
    with pytest.raises(LeaseSuperseded):
        await lab.store.release(dataclasses.replace(lease, attempt=2))
    with pytest.raises(NotFound):
        await lab.store.release(dataclasses.replace(lease, task_id=uuid.uuid4()))
    assert await snapshot(lab.store) == untouched

    lab.clock.advance(31)
    with pytest.raises(LeaseExpired):  # expired by the clock, before any sweep
        await lab.store.release(lease)
    assert await snapshot(lab.store) == untouched
    await lab.alive()
    await lab.store.sweep_expired()
    with pytest.raises(LeaseExpired):
        await lab.store.release(lease)


async def test_release_after_a_report_is_an_outcome_conflict_and_the_other_way_round(lab: Lab) -> None:
    await lab.host("h1", "d1", "d2")
    reported = await lab.running(device_id="d1")
    await lab.store.report(reported, Outcome.DONE)
    with pytest.raises(OutcomeConflict):
        await lab.store.release(reported)
    released = await lab.running(device_id="d2")
    await lab.store.release(released)
    with pytest.raises(OutcomeConflict):
        await lab.store.report(released, Outcome.DONE)
    with pytest.raises(LeaseExpired):
        await lab.store.renew(released)


async def test_release_of_a_task_that_ended_by_expiry_is_task_terminal(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(max_attempts=1)
    await lab.expire(lease)
    with pytest.raises(TaskTerminal):
        await lab.store.release(lease)


@pytest.mark.parametrize(("max_attempts", "status"), [(1, TaskStatus.FAILED), (2, TaskStatus.QUEUED)])
async def test_an_expiry_after_releases_counts_only_the_attempts_spent(
    lab: Lab, max_attempts: int, status: TaskStatus
) -> None:
    await lab.host("h1", "d1")
    task = await lab.submit(max_attempts=max_attempts)
    for _ in range(2):
        await lab.store.release(await lab.assign_one(task))
    lease = await lab.assign_one(task)
    await lab.expire(lease)
    view = await lab.store.get_task(task)
    assert (view.status, view.attempt_count, view.releases) == (status, 3, 2)


async def test_the_database_bounds_attempts_by_max_attempts_plus_releases(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(max_attempts=1)
    await lab.store.release(lease)
    async with lab.store.engine.connect() as conn:
        for sql, constraint in [
            ("UPDATE tasks SET attempt_count = 3 WHERE task_id = :t", "ck_tasks_attempt_count"),
            ("UPDATE tasks SET releases = 2 WHERE task_id = :t", "ck_tasks_releases"),
            (
                "UPDATE attempts SET end_reason = 'lease_expired' WHERE task_id = :t",
                "ck_attempts_end_reason_matches",
            ),
        ]:
            with pytest.raises(Exception, match=constraint):
                await conn.execute(text(sql), {"t": lease.task_id})
            await conn.rollback()


async def test_drain_host_drains_its_devices_until_returned(lab: Lab) -> None:
    await lab.host("h1", "d1", "d2")
    await lab.host("h2", "d3")
    running = await lab.running(device_id="d1")
    view = await lab.store.drain_host("h1", True, "maintenance")
    assert (view.host_id, view.online) == ("h1", True)
    assert [(d.device_id, d.state, d.drain_reason) for d in view.devices] == [
        ("d1", DeviceState.DRAINED, "maintenance"),
        ("d2", DeviceState.DRAINED, "maintenance"),
    ]
    # the running attempt goes on; nothing new goes to the host, even after it registers again
    await lab.store.renew(running)
    await lab.host("h1", "d1", "d2")
    task = await lab.submit(labels={"platform": "android"})
    assert [(m.task_id, m.device_id) for m in await lab.store.assign()] == [(task, "d3")]
    back = await lab.store.drain_host("h1", False)
    assert {d.device_id: d.drained for d in back.devices} == {"d1": False, "d2": False}
    with pytest.raises(NotFound):
        await lab.store.drain_host("h9", True)
