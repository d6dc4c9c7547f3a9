"""Device health against a real Postgres: consecutive infrastructure failures quarantine a device.

The rule is core's (`devsched.core.health`, unit-tested there); this checks where the store applies it
(a failed report with an infra step on either report path, a lease expiry, a device-fault release), that
a success resets the count, that every placement path skips a quarantined device, and that returning it
to service (`drain --undo`) lifts the quarantine.
"""

from __future__ import annotations

import pytest

from devsched.core.records import LeaseRef
from devsched.core.status import DeviceState, Outcome
from devsched.core.views import DeviceView
from devsched.store import Store
from support.sql_log import logged, statements
from support.store_lab import Lab

pytestmark = pytest.mark.integration

INFRA = {"steps": [{"name": "flash", "action": "noop", "args": {}, "infra": True}, {"name": "test", "action": "noop"}]}
FLASH_FAILED = {"steps": [{"name": "flash", "status": "failed", "exit_code": 1}, {"name": "test", "status": "skipped"}]}
TEST_FAILED = {"steps": [{"name": "flash", "status": "ok"}, {"name": "test", "status": "failed", "exit_code": 1}]}


async def _device(store: Store, device_id: str) -> DeviceView:
    for host in await store.list_hosts():
        for d in host.devices:
            if d.device_id == device_id:
                return d
    raise AssertionError(f"no device {device_id}")


async def _fail_infra(lab: Lab) -> None:
    lease = await lab.running(plan=INFRA, device_id="d1")
    await lab.store.report(lease, Outcome.FAILED, reason="step 'flash' failed", result=FLASH_FAILED)


async def test_three_infra_failures_quarantine_the_device_and_placement_skips_it(lab: Lab) -> None:
    await lab.host("h1", "d1")
    for n in (1, 2):
        await _fail_infra(lab)
        d = await _device(lab.store, "d1")
        assert (d.infra_failures, d.quarantined, d.state) == (n, False, DeviceState.AVAILABLE)
    await _fail_infra(lab)
    d = await _device(lab.store, "d1")
    assert (d.infra_failures, d.quarantined, d.state) == (3, True, DeviceState.QUARANTINED)
    assert d.quarantine_reason == "3 consecutive infrastructure failures (last: infra)"
    assert d.quarantined_since is not None

    task_id = await lab.submit()
    assert await lab.store.assign() == []  # the loop's pass skips it
    view = await lab.store.get_task(task_id)
    assert view.attempts == ()

    back = await lab.store.drain_device("d1", False)  # `devsched drain d1 --undo`
    assert (back.quarantined, back.infra_failures, back.state) == (False, 0, DeviceState.AVAILABLE)
    (assigned,) = await lab.store.assign()
    assert assigned.task_id == task_id


async def test_a_success_resets_the_count_and_a_test_failure_leaves_it(lab: Lab) -> None:
    await lab.host("h1", "d1")
    await _fail_infra(lab)
    await _fail_infra(lab)
    lease = await lab.running(plan=INFRA, device_id="d1")
    await lab.store.report(lease, Outcome.FAILED, reason="step 'test' failed", result=TEST_FAILED)
    assert (await _device(lab.store, "d1")).infra_failures == 2  # the code's failure, not the device's
    lease = await lab.running(device_id="d1")
    await lab.store.report(lease, Outcome.DONE)  # the fast path
    assert (await _device(lab.store, "d1")).infra_failures == 0
    await _fail_infra(lab)
    await _fail_infra(lab)
    assert not (await _device(lab.store, "d1")).quarantined


async def test_expiries_and_device_fault_releases_count(lab: Lab) -> None:
    await lab.host("h1", "d1")
    lease = await lab.running(device_id="d1", max_attempts=1)
    await lab.expire(lease)
    lab.clock.advance(31)  # past the device's grace
    await lab.alive()
    lease = await lab.running(device_id="d1")
    await lab.store.release(lease, reason="agent shutdown")  # not the device's fault
    assert (await _device(lab.store, "d1")).infra_failures == 1
    (again,) = await lab.store.assign()
    lease = LeaseRef(host_id=again.host_id, task_id=again.task_id, attempt=again.attempt, lease_id=again.lease_id)
    await lab.store.claim(lease)
    await lab.store.release(lease, reason="device_fault: adb device vanished")
    assert (await _device(lab.store, "d1")).infra_failures == 2
    await lab.store.request_cancel(again.task_id)  # queued again: it would race the next task for the device
    await _fail_infra(lab)
    d = await _device(lab.store, "d1")
    assert (d.quarantined, d.state) == (True, DeviceState.QUARANTINED)


async def test_a_quarantined_device_is_skipped_by_a_submit_and_by_a_report_hand_over(
    inline: tuple[Lab, list[object]],
) -> None:
    lab, _ = inline
    await lab.host("h1", "d1")
    for n in range(3):
        task_id = await lab.submit(plan=INFRA, device_id="d1")
        (a,) = (await lab.store.get_task(task_id)).attempts  # placed by its own submit
        lease = LeaseRef(host_id=a.host_id, task_id=task_id, attempt=a.attempt, lease_id=a.lease_id)
        await lab.store.claim(lease)
        if n < 2:
            await lab.store.report(lease, Outcome.FAILED, reason="flash failed", result=FLASH_FAILED)
            continue
        waiting = await lab.submit(device_id="d1")  # queued behind the running attempt
        await lab.store.report(lease, Outcome.FAILED, reason="flash failed", result=FLASH_FAILED)
        assert (await lab.store.get_task(waiting)).attempts == ()  # the hand-over skipped it
    assert (await _device(lab.store, "d1")).quarantined
    submitted = await lab.submit(device_id="d1")
    assert (await lab.store.get_task(submitted)).attempts == ()  # and so does a submit's placement


async def test_threshold_zero_never_quarantines(database_url: str, lab: Lab) -> None:
    store = Store.connect(database_url, clock=lab.clock, quarantine_after=0)
    try:
        other = Lab(store, lab.clock)
        await other.host("h1", "d1")
        for _ in range(4):
            await _fail_infra(other)
        d = await _device(store, "d1")
        assert (d.infra_failures, d.quarantined) == (4, False)
    finally:
        await store.close()


async def test_a_sweep_is_four_statements_whatever_its_size_its_devices_read_once_and_written_with_its_tasks(
    lab: Lab,
) -> None:
    """Thousands of expired leases stay one batch: the devices are read once, and written by the tasks' statement."""
    devices = [f"d{i:02}" for i in range(12)]
    await lab.host("h1", *devices)
    for _ in devices:
        await lab.running()
    lab.clock.advance(31)
    await lab.alive()
    with statements(lab.store) as sent:
        swept = await lab.store.sweep_expired()
        await logged()
    assert len(swept) == len(devices)
    # each statement once (heard through SQLAlchemy and asyncpg both), without the transaction's own
    work = list(dict.fromkeys(" ".join(s.split()) for s in sent if "tasks" in s or "devices" in s))
    # the candidates locked; their attempts ended; their devices locked and read; the tasks, events and devices
    assert len(work) == 4, [w[:80] for w in work]
    assert [s for s in work if "infra_failures" in s] == work[2:]
    assert all(part in work[3] for part in ("UPDATE tasks", "UPDATE devices", "INSERT INTO outbox"))
    for device_id in devices:
        assert (await _device(lab.store, device_id)).infra_failures == 1
