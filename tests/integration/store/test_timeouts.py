"""Time limits against a real Postgres: queue timeouts, deadlines and attempt timeouts.

The rules are core's (`devsched.core.timeouts`); this checks that a renewal carries the stop, that the
sweeper's pass (`Store.sweep_timeouts`) fails, retries or ends exactly the tasks that are due, and that two
sweepers at once end each task once.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from devsched.core.errors import TaskTerminal
from devsched.core.retrying import RetryCause, RetryPolicy
from devsched.core.status import AttemptStatus, DeviceState, EndReason, Outcome, TaskStatus
from devsched.store import ManualClock, Store
from support.store_lab import Lab

pytestmark = pytest.mark.integration


async def test_a_queued_task_fails_once_its_queue_timeout_passed(lab: Lab) -> None:
    task_id = await lab.submit(queue_timeout_s=10.0)  # no device at all
    lab.clock.advance(9.9)
    assert await lab.store.sweep_timeouts() == ([], [])
    lab.clock.advance(0.1)
    failed, ended = await lab.store.sweep_timeouts()
    assert (failed, ended) == ([task_id], [])
    view = await lab.store.get_task(task_id)
    assert (view.status, view.reason, view.queue_timeout_s) == (TaskStatus.FAILED, "queue_timeout", 10.0)


async def test_a_queued_task_fails_at_its_deadline(lab: Lab) -> None:
    task_id = await lab.submit(deadline=lab.clock.current + timedelta(seconds=3))
    assert await lab.store.sweep_timeouts() == ([], [])
    lab.clock.advance(3)
    assert (await lab.store.sweep_timeouts())[0] == [task_id]
    assert (await lab.store.get_task(task_id)).reason == "deadline_exceeded"


async def test_tasks_without_limits_are_never_touched(lab: Lab) -> None:
    await lab.host("h1", "d1")
    running = await lab.running()
    queued = await lab.submit()
    lab.clock.advance(10_000)
    assert await lab.store.sweep_timeouts() == ([], [])
    assert (await lab.store.get_task(queued)).status is TaskStatus.QUEUED
    assert (await lab.store.get_task(running.task_id)).status is TaskStatus.DISPATCHED


async def test_a_renewal_says_stop_once_the_attempt_timeout_passed(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(attempt_timeout_s=10.0)
    lab.clock.advance(9)
    assert (await lab.store.renew(lease)).stop is None
    lab.clock.advance(1)
    assert (await lab.store.renew(lease, {"step": "flash", "index": 0, "of": 1})).stop == "attempt_timeout"
    # the host stops the attempt and reports it failed with the limit as its reason
    await lab.store.report(lease, Outcome.FAILED, reason="attempt_timeout")
    view = await lab.store.get_task(lease.task_id)
    assert (view.status, view.reason) == (TaskStatus.FAILED, "attempt_timeout")


async def test_a_renewal_says_deadline_exceeded_past_the_deadline(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(deadline=lab.clock.current + timedelta(seconds=5), attempt_timeout_s=100.0)
    lab.clock.advance(5)
    assert (await lab.store.renew(lease)).stop == "deadline_exceeded"


async def test_the_sweeper_ends_an_attempt_its_host_did_not_stop(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(attempt_timeout_s=10.0, lease_ttl_s=20)
    for _ in range(3):  # the host keeps renewing, past its timeout, without stopping
        lab.clock.advance(9.5)
        await lab.store.renew(lease)
    assert await lab.store.sweep_timeouts() == ([], [])  # 28.5 s: within the timeout and one ttl (20 s)
    lab.clock.advance(1.5)
    _, (ended,) = await lab.store.sweep_timeouts()
    assert (ended.task_id, ended.task_status, ended.reason) == (lease.task_id, TaskStatus.FAILED, "attempt_timeout")
    view = await lab.store.get_task(lease.task_id)
    (attempt,) = view.attempts
    assert (view.status, view.reason) == (TaskStatus.FAILED, "attempt_timeout")
    assert (attempt.status, attempt.end_reason) == (AttemptStatus.EXPIRED, EndReason.ATTEMPT_TIMEOUT)
    with pytest.raises(TaskTerminal):
        await lab.store.renew(lease)
    # the host may still be running a step there: the device waits out the post-expiry grace
    await lab.alive()
    host = (await lab.store.list_hosts())[0]
    assert [d.state for d in host.devices] == [DeviceState.AVAILABLE]
    assert await lab.store.assign() == []


async def test_an_attempt_timeout_the_policy_retries_is_queued_again_with_backoff(lab: Lab) -> None:
    await lab.host("h1", "d1")
    policy = RetryPolicy(on=frozenset({RetryCause.ATTEMPT_TIMEOUT}), initial_s=2, max_s=2)
    lease = await lab.running(attempt_timeout_s=5.0, lease_ttl_s=10, retry=policy)
    lab.clock.advance(8)
    await lab.store.renew(lease)
    lab.clock.advance(7)
    _, (ended,) = await lab.store.sweep_timeouts()
    assert ended.task_status is TaskStatus.QUEUED
    view = await lab.store.get_task(lease.task_id)
    assert view.not_before == lab.clock.current + timedelta(seconds=2)


async def test_the_deadline_ends_an_attempt_in_flight(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(deadline=lab.clock.current + timedelta(seconds=5), lease_ttl_s=10)
    lab.clock.advance(8)
    await lab.store.renew(lease)
    lab.clock.advance(7)
    _, (ended,) = await lab.store.sweep_timeouts()
    assert (ended.task_status, ended.reason) == (TaskStatus.FAILED, "deadline_exceeded")
    (attempt,) = (await lab.store.get_task(lease.task_id)).attempts
    assert attempt.end_reason is EndReason.DEADLINE_EXCEEDED


async def test_two_sweepers_at_once_end_each_task_once(database_url: str, lab: Lab, clock: ManualClock) -> None:
    await lab.host("h1", *[f"d{i}" for i in range(6)])
    leases = [await lab.running(attempt_timeout_s=1.0, lease_ttl_s=5) for _ in range(6)]
    queued = [await lab.submit(queue_timeout_s=1.0, labels={"platform": "none"}) for _ in range(6)]
    clock.advance(4)
    for lease in leases:
        await lab.store.renew(lease)
    clock.advance(3)
    other = Store.connect(database_url, clock=clock)
    try:
        results = await asyncio.gather(*(s.sweep_timeouts(limit=4) for s in (lab.store, other, lab.store, other)))
    finally:
        await other.close()
    failed = [t for f, _ in results for t in f]
    ended = [e.task_id for _, e in results for e in e]
    assert sorted(failed) == sorted(queued)
    assert sorted(ended) == sorted(lease.task_id for lease in leases)
