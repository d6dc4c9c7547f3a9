"""A device's history (issue 15): `list_tasks(device_id=...)` against a real Postgres.

The history is every task that had an attempt on the device (a task retried elsewhere is in the history
of each device it ran on), newest first, with the same cursor paging as the full list, and combines with
the `status` and `kind` filters.
"""

from __future__ import annotations

import uuid

import pytest

from devsched.core.records import LeaseRef
from devsched.core.status import Outcome, TaskKind, TaskStatus
from devsched.store import Store
from support.store_lab import Lab

pytestmark = pytest.mark.integration

CHECK = {"steps": [{"name": "adb-alive", "action": "noop", "args": {}}]}


async def _history(
    store: Store, device_id: str, *, status: TaskStatus | None = None, kind: TaskKind | None = None
) -> list[uuid.UUID]:
    page = await store.list_tasks(device_id=device_id, status=status, kind=kind, limit=1000)
    assert page.next is None
    return [t.task_id for t in page.tasks]


async def _lease(store: Store, task_id: uuid.UUID) -> tuple[LeaseRef, str]:
    a = (await store.get_task(task_id)).attempts[-1]
    return LeaseRef(host_id=a.host_id, task_id=task_id, attempt=a.attempt, lease_id=a.lease_id), a.device_id


async def test_history_lists_tasks_by_the_devices_their_attempts_ran_on(lab: Lab) -> None:
    await lab.host("h1", "d1", "d2", "d3")
    await lab.store.set_health_check("adb", {}, CHECK, 3600)
    assert await lab.store.health_pass() == (3, 3)  # never checked: one check per device
    checks: dict[str, uuid.UUID] = {}
    for t in (await lab.store.list_tasks(kind=TaskKind.HEALTH)).tasks:
        assert t.health_device_id is not None
        checks[t.health_device_id] = t.task_id
        lease, _ = await _lease(lab.store, t.task_id)
        await lab.store.claim(lease)
        await lab.store.report(lease, Outcome.DONE)
    await lab.store.delete_health_check("adb")

    lab.clock.advance(1)
    moved = await lab.submit(max_attempts=2)  # runs on one device, expires, moves on
    first = await lab.assign_one(moved)
    _, first_device = await _lease(lab.store, moved)
    await lab.store.claim(first)
    await lab.expire(first)  # the first device waits out its grace: the retry goes to another one
    second = await lab.assign_one(moved)
    _, second_device = await _lease(lab.store, moved)
    assert second_device != first_device
    await lab.store.report(second, Outcome.FAILED, reason="flash failed")

    lab.clock.advance(1)
    pinned = await lab.submit(device_id="d3")
    lease = await lab.assign_one(pinned)
    await lab.store.report(lease, Outcome.DONE)
    lab.clock.advance(1)
    never = await lab.submit(device_id="d3")  # cancelled while queued: no attempt, in no history
    await lab.store.request_cancel(never)

    expected: dict[str, list[uuid.UUID]] = {d: [checks[d]] for d in ("d1", "d2", "d3")}
    expected[first_device].insert(0, moved)
    expected[second_device].insert(0, moved)
    expected["d3"].insert(0, pinned)
    for device, ids in expected.items():
        assert await _history(lab.store, device) == ids, device
        assert await _history(lab.store, device, kind=TaskKind.HEALTH) == [checks[device]]
        assert await _history(lab.store, device, kind=TaskKind.USER) == ids[:-1]
        assert await _history(lab.store, device, status=TaskStatus.DONE) == [i for i in ids if i != moved]
    assert await _history(lab.store, first_device, status=TaskStatus.FAILED, kind=TaskKind.USER) == [moved]
    assert await _history(lab.store, "d3", status=TaskStatus.CANCELLED) == []
    assert await _history(lab.store, "no-such-device") == []
    all_ids = [t.task_id for t in (await lab.store.list_tasks(limit=1000)).tasks]
    assert len(all_ids) == 6  # the unfiltered list is unchanged
    assert never in all_ids


async def test_history_pages_with_the_list_cursor(lab: Lab) -> None:
    await lab.host("h1", "d1", "d2")
    ran: dict[str, list[uuid.UUID]] = {"d1": [], "d2": []}
    for i in range(7):
        device = "d1" if i % 3 else "d2"
        task = await lab.submit(device_id=device)
        lease = await lab.assign_one(task)
        await lab.store.report(lease, Outcome.DONE)
        ran[device].append(task)
        lab.clock.advance(1)
    seen: list[uuid.UUID] = []
    after = None
    pages = 0
    while True:
        page = await lab.store.list_tasks(device_id="d1", limit=2, after=after)
        seen += [t.task_id for t in page.tasks]
        pages += 1
        if page.next is None:
            break
        after = page.next
    assert seen == list(reversed(ran["d1"]))
    assert pages == 2  # 4 tasks, 2 a page: the second page is the last
