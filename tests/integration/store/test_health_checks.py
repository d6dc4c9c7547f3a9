"""Health checks against a real Postgres (issue 13 item 2): the checks, and the health pass.

The pass submits a `health` task for each due device (quarantined, never checked, or past its check's
interval) exactly once however many passes run at once, places it on its device even while the device
is quarantined (user tasks still skip it), and the task's outcome returns the device (done) or keeps
it out (failed).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy import text

from devsched.core.errors import NotFound
from devsched.core.health import HEALTH_CHECK_FAILED, HEALTH_PRIORITY
from devsched.core.records import LeaseRef
from devsched.core.status import DeviceState, Outcome, TaskKind, TaskStatus
from devsched.core.views import DeviceView, TaskView
from devsched.store import Store
from support.store_lab import Lab

pytestmark = pytest.mark.integration

CHECK = {"steps": [{"name": "adb-alive", "action": "noop", "args": {}}]}
INFRA = {"steps": [{"name": "flash", "action": "noop", "args": {}, "infra": True}]}
FLASH_FAILED = {"steps": [{"name": "flash", "status": "failed", "exit_code": 1}]}


async def _device(store: Store, device_id: str) -> DeviceView:
    for host in await store.list_hosts():
        for d in host.devices:
            if d.device_id == device_id:
                return d
    raise AssertionError(f"no device {device_id}")


async def _health_tasks(store: Store) -> list[TaskView]:
    page = await store.list_tasks(kind=TaskKind.HEALTH, limit=1000)
    return list(page.tasks)


async def _quarantine(lab: Lab, device_id: str) -> None:
    for _ in range(3):
        lease = await lab.running(plan=INFRA, device_id=device_id)
        await lab.store.report(lease, Outcome.FAILED, reason="flash failed", result=FLASH_FAILED)
    assert (await _device(lab.store, device_id)).quarantined


async def _lease_of(store: Store, task_id: uuid.UUID) -> LeaseRef:
    (a,) = (await store.get_task(task_id)).attempts
    return LeaseRef(host_id=a.host_id, task_id=task_id, attempt=a.attempt, lease_id=a.lease_id)


async def test_checks_are_set_listed_replaced_and_removed_by_name(store: Store) -> None:
    first = await store.set_health_check("adb", {"platform": "android"}, CHECK, 3600)
    assert (first.name, dict(first.selector.labels), first.interval_s) == ("adb", {"platform": "android"}, 3600)
    await store.set_health_check("any", {}, CHECK, 60)
    again = await store.set_health_check("adb", {"platform": "ios"}, CHECK, 120)  # replaces it
    assert (dict(again.selector.labels), again.interval_s, again.created_at) == (
        {"platform": "ios"},
        120,
        first.created_at,
    )
    assert [c.name for c in await store.list_health_checks()] == ["adb", "any"]
    removed = await store.delete_health_check("adb")
    assert removed.name == "adb"
    assert [c.name for c in await store.list_health_checks()] == ["any"]
    with pytest.raises(NotFound):
        await store.delete_health_check("adb")
    await store.set_health_check("adb", {}, CHECK, 60)  # a removed name may be set again
    assert [c.name for c in await store.list_health_checks()] == ["adb", "any"]


async def test_a_quarantined_device_takes_its_health_check_while_user_tasks_skip_it(lab: Lab) -> None:
    await lab.host("h1", "d1")
    await _quarantine(lab, "d1")
    waiting = await lab.submit(device_id="d1")
    assert await lab.store.health_pass() == (0, 0)  # no check applies: nothing to run
    await lab.store.set_health_check("adb", {"platform": "android"}, CHECK, 3600)

    assert await lab.store.health_pass() == (1, 1)
    (health,) = await _health_tasks(lab.store)
    assert (health.kind, health.health_device_id, health.name) == (TaskKind.HEALTH, "d1", "health:adb")
    assert (health.status, health.priority, health.max_attempts) == (TaskStatus.ASSIGNED, HEALTH_PRIORITY, 1)
    assert health.selector.device_id == "d1"
    assert dict(health.plan) == CHECK
    assert (await _device(lab.store, "d1")).state is DeviceState.QUARANTINED  # until it passes
    assert await lab.store.assign() == []  # the user task still skips the device
    assert (await lab.store.get_task(waiting)).attempts == ()
    assert await lab.store.health_pass() == (0, 0)  # one open health task per device

    lease = await _lease_of(lab.store, health.task_id)
    await lab.store.claim(lease)
    await lab.store.report(lease, Outcome.DONE)
    d = await _device(lab.store, "d1")
    assert (d.quarantined, d.infra_failures, d.state) == (False, 0, DeviceState.AVAILABLE)
    (assigned,) = await lab.store.assign()
    assert assigned.task_id == waiting
    user = await lab.store.list_tasks(kind=TaskKind.USER, limit=1000)
    assert health.task_id not in {t.task_id for t in user.tasks}
    assert all(t.kind is TaskKind.USER for t in user.tasks)


async def test_a_failed_health_check_keeps_the_device_out_and_a_later_one_may_return_it(lab: Lab) -> None:
    await lab.host("h1", "d1")
    await _quarantine(lab, "d1")
    reason = (await _device(lab.store, "d1")).quarantine_reason
    await lab.store.set_health_check("adb", {}, CHECK, 3600)
    assert await lab.store.health_pass() == (1, 1)
    (health,) = await _health_tasks(lab.store)
    lease = await _lease_of(lab.store, health.task_id)
    await lab.store.claim(lease)
    await lab.store.report(lease, Outcome.FAILED, reason="adb not answering")
    d = await _device(lab.store, "d1")
    assert (d.quarantined, d.quarantine_reason) == (True, reason)  # still out, for its first reason
    assert (await lab.store.get_task(health.task_id)).status is TaskStatus.FAILED  # one attempt, not retried

    assert await lab.store.health_pass() == (1, 1)  # a quarantined device is due again at once
    second = next(t for t in await _health_tasks(lab.store) if t.task_id != health.task_id)
    lease = await _lease_of(lab.store, second.task_id)
    await lab.store.claim(lease)
    await lab.store.report(lease, Outcome.DONE)
    assert not (await _device(lab.store, "d1")).quarantined


async def test_a_passing_check_on_a_device_in_service_stamps_it_and_a_failing_one_quarantines_it(lab: Lab) -> None:
    await lab.store.set_health_check("adb", {}, CHECK, 600)
    await lab.host("h1", "d1")
    waiting = await lab.submit(device_id="d1")  # queued before the pass: the check still goes first
    assert await lab.store.health_pass() == (1, 1)  # never checked: due before its first task
    (health,) = await _health_tasks(lab.store)
    assert (await lab.store.get_task(waiting)).attempts == ()
    lease = await _lease_of(lab.store, health.task_id)
    await lab.store.claim(lease)
    await lab.store.report(lease, Outcome.DONE)
    assert (await _device(lab.store, "d1")).state is DeviceState.AVAILABLE
    assert await lab.store.health_pass() == (0, 0)  # checked: not due before its interval
    lease = await lab.assign_one(waiting)
    await lab.store.claim(lease)
    await lab.store.report(lease, Outcome.DONE)

    lab.clock.advance(601)  # the interval passed
    await lab.alive()
    assert await lab.store.health_pass() == (1, 1)
    second = next(t for t in await _health_tasks(lab.store) if t.task_id != health.task_id)
    lease = await _lease_of(lab.store, second.task_id)
    await lab.store.claim(lease)
    await lab.store.report(lease, Outcome.FAILED, reason="battery swollen")
    d = await _device(lab.store, "d1")
    assert (d.quarantined, d.quarantine_reason, d.state) == (True, HEALTH_CHECK_FAILED, DeviceState.QUARANTINED)


async def test_only_online_undrained_devices_a_check_applies_to_are_due(lab: Lab) -> None:
    await lab.host("h1", "d1", "d2", platform="android")
    await lab.host("h2", "i1", platform="ios")
    await lab.store.drain_device("d2", True)
    await lab.store.set_health_check("adb", {"platform": "android"}, CHECK, 600)
    assert await lab.store.health_pass() == (1, 1)
    assert [t.health_device_id for t in await _health_tasks(lab.store)] == ["d1"]
    lab.clock.advance(3600)  # every host offline (no heartbeat)
    await lab.store.drain_device("d2", False)
    assert await lab.store.health_pass() == (0, 0)


async def test_concurrent_passes_create_one_health_task_per_due_device(database_url: str, lab: Lab) -> None:
    devices = [f"d{i}" for i in range(12)]
    await lab.host("h1", *devices)
    await lab.store.set_health_check("adb", {}, CHECK, 600)
    others = [Store.connect(database_url, clock=lab.clock) for _ in range(3)]
    try:
        await asyncio.gather(*(s.health_pass(limit=5) for s in [lab.store, *others] for _ in range(3)))
        await lab.store.health_pass()  # whatever a pass skipped (held by another) is due still
    finally:
        for s in others:
            await s.close()
    tasks = await _health_tasks(lab.store)
    assert sorted(t.health_device_id or "" for t in tasks) == sorted(devices)
    async with lab.store.engine.connect() as conn:
        rows = (await conn.execute(text("SELECT count(*) FROM tasks WHERE kind = 'health'"))).scalar_one()
    assert rows == len(devices)
