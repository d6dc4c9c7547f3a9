"""A task's retry policy against a real Postgres: backoff respected by every assigner, another device preferred.

The rules are core's (`devsched.core.retrying`, unit-tested there); this checks what the store does with
them: the failed attempt kept, the task queued with `not_before` (by the database clock) and the device to
avoid, placement (the loop's pass, a submit's, a report's hand-over) skipping it until then, and a task
without a policy behaving as before.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta

import pytest

from devsched.core.events import TaskEvent
from devsched.core.records import LeaseRef
from devsched.core.retrying import RetryCause, RetryPolicy
from devsched.core.status import AttemptStatus, EventKind, Outcome, TaskStatus
from devsched.store import Committed, OutboxMessage, Published, Store
from support.store_lab import Lab, ref

pytestmark = pytest.mark.integration

PLAN = {"steps": [{"name": "flash", "action": "noop", "args": {}, "infra": True}, {"name": "test", "action": "noop"}]}
POLICY = RetryPolicy()  # infra, lease_expired, released; 5 s, doubling, at most 300 s


def _failed(step: str) -> dict[str, object]:
    other = "test" if step == "flash" else "flash"
    return {"steps": [{"name": step, "status": "failed", "exit_code": 1}, {"name": other, "status": "skipped"}]}


async def _placed(lab: Lab, **kwargs: object) -> LeaseRef:
    """A task its own submit placed (an inline store), claimed."""
    task_id = await lab.submit(**kwargs)
    (a,) = (await lab.store.get_task(task_id)).attempts
    lease = LeaseRef(host_id=a.host_id, task_id=task_id, attempt=a.attempt, lease_id=a.lease_id)
    await lab.store.claim(lease)
    return lease


async def _events(store: Store, task_id: uuid.UUID) -> list[TaskEvent]:
    published: list[OutboxMessage] = []

    async def publish(batch: Sequence[OutboxMessage]) -> Published:
        published.extend(batch)
        return Published([m.id for m in batch])

    await store.relay_outbox(publish, limit=1000)
    return [m.event for m in published if isinstance(m.event, TaskEvent) and m.event.task_id == task_id]


async def test_an_infra_failure_waits_its_backoff_then_runs_on_another_device(lab: Lab) -> None:
    await lab.host("h1", "d1", "d2")
    lease = await lab.running(plan=PLAN, retry=POLICY)
    failed_on = (await lab.store.get_task(lease.task_id)).attempts[0].device_id
    receipt = await lab.store.report(lease, Outcome.FAILED, reason="step 'flash' failed", result=_failed("flash"))
    assert receipt.status is TaskStatus.QUEUED

    view = await lab.store.get_task(lease.task_id)
    assert (view.status, view.reason, view.not_before) == (
        TaskStatus.QUEUED, None, receipt.recorded_at + timedelta(seconds=5)
    )  # fmt: skip
    assert view.attempts[0].status is AttemptStatus.FAILED
    assert view.pending_reason is not None
    assert view.pending_reason.startswith("retry_backoff:")

    lab.clock.advance(4.9)
    await lab.alive()
    assert await lab.store.assign() == []  # both devices are free: the backoff alone holds it back
    lab.clock.advance(0.2)
    await lab.alive()
    (again,) = await lab.store.assign()
    assert (again.task_id, again.attempt) == (lease.task_id, 2)
    assert again.device_id != failed_on

    requeued = [e for e in await _events(lab.store, lease.task_id) if e.event is EventKind.REQUEUED]
    assert [(e.reason, e.attempt, e.device_id) for e in requeued] == [("infra", 1, failed_on)]


async def test_the_failed_device_is_taken_when_it_is_the_only_one_free(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(plan=PLAN, retry=POLICY)
    await lab.store.report(lease, Outcome.FAILED, reason="flash failed", result=_failed("flash"))
    lab.clock.advance(6)
    await lab.alive()
    (again,) = await lab.store.assign()
    assert (again.task_id, again.device_id) == (lease.task_id, "d1")


async def test_a_failed_test_step_ends_the_task_under_the_default_policy(lab: Lab) -> None:
    await lab.host("h1", "d1", "d2")
    lease = await lab.running(plan=PLAN, retry=POLICY)
    receipt = await lab.store.report(lease, Outcome.FAILED, reason="tests failed", result=_failed("test"))
    view = await lab.store.get_task(lease.task_id)
    assert (receipt.status, view.status, view.reason, view.attempt_count) == (
        TaskStatus.FAILED, TaskStatus.FAILED, "tests failed", 1
    )  # fmt: skip


async def test_step_failed_is_retried_when_the_policy_names_it(lab: Lab) -> None:
    await lab.host("h1", "d1")
    policy = RetryPolicy(on=frozenset({RetryCause.STEP_FAILED}), initial_s=1, max_s=1)
    lease = await lab.running(plan=PLAN, retry=policy, max_attempts=2)
    await lab.store.report(lease, Outcome.FAILED, reason="tests failed", result=_failed("test"))
    lab.clock.advance(1)
    await lab.alive()
    (again,) = await lab.store.assign()
    await lab.store.claim(ref(again))
    # the last attempt: a failure now ends the task, whatever the policy
    await lab.store.report(ref(again), Outcome.FAILED, reason="tests failed again", result=_failed("test"))
    view = await lab.store.get_task(lease.task_id)
    assert (view.status, view.reason, view.attempt_count) == (TaskStatus.FAILED, "tests failed again", 2)


async def test_without_a_policy_an_infra_failure_ends_the_task_as_before(lab: Lab) -> None:
    await lab.host("h1", "d1", "d2")
    lease = await lab.running(plan=PLAN)
    receipt = await lab.store.report(lease, Outcome.FAILED, reason="flash failed", result=_failed("flash"))
    view = await lab.store.get_task(lease.task_id)
    assert (receipt.status, view.status, view.not_before, view.retry) == (
        TaskStatus.FAILED,
        TaskStatus.FAILED,
        None,
        None,
    )


async def test_a_lease_expiry_under_a_policy_backs_off_and_avoids_the_device(lab: Lab) -> None:
    await lab.host("h1", "d1", "d2")
    lease = await lab.running(retry=POLICY, lease_ttl_s=10)
    device = (await lab.store.get_task(lease.task_id)).attempts[0].device_id
    await lab.expire(lease, ttl=10)
    view = await lab.store.get_task(lease.task_id)
    assert view.status is TaskStatus.QUEUED
    assert view.not_before == lab.clock.current + timedelta(seconds=5)
    assert await lab.store.assign() == []
    lab.clock.advance(5)
    await lab.alive()
    (again,) = await lab.store.assign()
    assert again.device_id != device  # the device is in its grace anyway; the other one is free


async def test_a_release_under_a_policy_backs_off(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(retry=POLICY)
    receipt = await lab.store.release(lease, reason="shutdown")
    view = await lab.store.get_task(lease.task_id)
    assert (view.status, view.not_before, view.releases) == (
        TaskStatus.QUEUED, receipt.recorded_at + timedelta(seconds=5), 1
    )  # fmt: skip
    assert await lab.store.assign() == []


async def test_a_policy_without_released_fails_a_released_task(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(retry=RetryPolicy(on=frozenset({RetryCause.INFRA})))
    receipt = await lab.store.release(lease, reason="shutdown")
    view = await lab.store.get_task(lease.task_id)
    assert (receipt.status, view.reason) == (TaskStatus.FAILED, "released")


async def test_inline_placement_and_hand_over_skip_a_task_in_its_backoff(inline: tuple[Lab, list[Committed]]) -> None:
    lab, _ = inline
    await lab.host("h1", "d1", "d2")
    lease = await _placed(lab, plan=PLAN, retry=POLICY)  # placed by its submit
    other = await _placed(lab)  # on the second device
    # the failure frees its device, and the hand-over gives it to nobody: the only queued task backs off
    await lab.store.report(lease, Outcome.FAILED, reason="flash failed", result=_failed("flash"))
    assert (await lab.store.get_task(lease.task_id)).status is TaskStatus.QUEUED
    # a newer submit is placed on that free device, though the retried task is ahead of it in the queue
    newer = await lab.submit()
    assert (await lab.store.get_task(newer)).status is TaskStatus.ASSIGNED
    # the other device, freed by a report, is handed over only once the backoff is over
    lab.clock.advance(6)
    await lab.alive()
    await lab.store.report(other, Outcome.DONE)
    view = await lab.store.get_task(lease.task_id)
    assert (view.status, view.attempt_count) == (TaskStatus.ASSIGNED, 2)
