"""Why queued tasks wait, in a listing, against a real Postgres: every reason, for a page at once.

The rule is core's (`devsched.core.pending`, unit-tested there); this checks the counts the store gives
it for each kind of pool (quarantined, drained, offline, busy, none at all, a retry's backoff), that a
listing says what `get` says, and that a page costs the same statements whatever its number of queued tasks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import pytest

from devsched.core.records import LeaseRef
from devsched.core.retrying import RetryPolicy
from devsched.core.status import Outcome, TaskStatus
from devsched.store import DeviceSpec
from support.sql_log import logged, statements
from support.store_lab import Lab

pytestmark = pytest.mark.integration

#: What asyncpg sends of its own the first time a connection meets a type: not the listing's cost.
_INTROSPECTION = re.compile(r"typeinfo_tree|'jit'")

INFRA = {"steps": [{"name": "flash", "action": "noop", "args": {}, "infra": True}, {"name": "test", "action": "noop"}]}
FLASH_FAILED = {"steps": [{"name": "flash", "status": "failed", "exit_code": 1}, {"name": "test", "status": "skipped"}]}


async def _host(lab: Lab, host_id: str, device_id: str, pool: str) -> None:
    await lab.store.register_host(host_id, [DeviceSpec(device_id, {"pool": pool})])


async def _fail_infra(lab: Lab, device_id: str, **kwargs: object) -> LeaseRef:
    lease = await lab.running(plan=INFRA, device_id=device_id, **kwargs)
    await lab.store.report(lease, Outcome.FAILED, reason="step 'flash' failed", result=FLASH_FAILED)
    return lease


async def _pools(lab: Lab) -> dict[str, str]:
    """One host per kind of pool, and one queued task for each: the code each should get, by task name."""
    await _host(lab, "h-quarantined", "dq", "quarantined")
    for _ in range(3):
        await _fail_infra(lab, "dq")
    await _host(lab, "h-drained", "dd", "drained")
    await lab.store.drain_device("dd", True, "maintenance")
    await _host(lab, "h-busy", "db", "busy")
    await lab.running(labels={"pool": "busy"})
    await _host(lab, "h-free", "df", "free")
    await _host(lab, "h-retry", "dr", "retry")
    await _host(lab, "h-offline", "do", "offline")
    lab.clock.advance(20)  # three heartbeats of 5 s missed by every host ...
    for host_id in ("h-quarantined", "h-drained", "h-busy", "h-free", "h-retry"):
        await lab.store.heartbeat(host_id)  # ... but h-offline
    await _fail_infra(lab, "dr", retry=RetryPolicy())  # queued again, in its backoff
    expected = {
        "quarantined": "devices_quarantined",
        "drained": "devices_drained",
        "offline": "no_online_device",
        "busy": "devices_busy",
        "free": "awaiting_assignment",
        "nowhere": "no_matching_device",
    }
    for pool in expected:
        await lab.submit(name=pool, labels={"pool": pool})
    return expected


def _codes(reasons: Mapping[str, str | None]) -> dict[str, str]:
    return {name: (reason or "").partition(":")[0] for name, reason in reasons.items()}


async def test_a_listing_says_why_each_queued_task_waits_as_get_does(lab: Lab) -> None:
    expected = await _pools(lab)
    page = await lab.store.list_tasks(status=TaskStatus.QUEUED, limit=100)
    by_name = {t.name: t.pending_reason for t in page.tasks if t.name}
    assert _codes(by_name) == expected
    assert "(1 quarantined after repeated infrastructure failures)" in (by_name["quarantined"] or "")
    (retrying,) = [t for t in page.tasks if t.name is None]  # the infra failure under a retry policy
    assert (retrying.pending_reason or "").startswith("retry_backoff: attempt 1 ended")
    for task in page.tasks:
        assert (await lab.store.get_task(task.task_id)).pending_reason == task.pending_reason
    everything = await lab.store.list_tasks(limit=100)  # a listing of every status: only queued ones say
    assert {t.task_id for t in everything.tasks if t.pending_reason} == {t.task_id for t in page.tasks}


async def test_a_page_costs_the_same_statements_with_one_queued_task_or_many(lab: Lab) -> None:
    await _host(lab, "h1", "d1", "free")

    async def listing_cost() -> tuple[int, int]:
        with statements(lab.store) as sent:
            page = await lab.store.list_tasks(status=TaskStatus.QUEUED, limit=100)
            await logged()
        assert all(t.pending_reason for t in page.tasks)
        work = [x for x in sent if not _INTROSPECTION.search(x)]
        assert sum("WITH ORDINALITY" in x for x in work) == 1, work  # the devices counted once, and heard
        return len(page.tasks), len(work)

    await lab.submit(labels={"pool": "nowhere"})
    one, cost_of_one = await listing_cost()
    for i in range(24):
        await lab.submit(labels={"pool": ("nowhere", "free", "other")[i % 3]}, priority=i % 5)
    many, cost_of_many = await listing_cost()
    assert (one, many) == (1, 25)
    assert cost_of_many == cost_of_one


async def test_a_listing_without_queued_tasks_reads_no_devices(lab: Lab) -> None:
    await _host(lab, "h1", "d1", "free")
    await lab.running(labels={"pool": "free"})
    with statements(lab.store) as sent:
        page = await lab.store.list_tasks(limit=100)
        await logged()
    assert [t.pending_reason for t in page.tasks] == [None]
    assert not [s for s in sent if "devices" in s]


async def test_a_health_check_waits_for_its_quarantined_device_as_any_task_waits_for_a_free_one(lab: Lab) -> None:
    """A quarantined device is out of service for user tasks, not for its health check (the health pass's)."""
    await _host(lab, "h1", "d1", "pool")
    for n in range(3):  # three lease expiries: quarantined, and (the last one's) in its post-expiry grace
        if n:
            lab.clock.advance(31)  # past the previous expiry's grace
            await lab.alive()
        lease = await lab.running(device_id="d1", max_attempts=1)
        await lab.expire(lease)
    user = await lab.submit(name="user", device_id="d1")
    await lab.store.set_health_check("adb", {}, {"steps": [{"name": "check", "action": "noop"}]}, 3600)
    assert await lab.store.health_pass() == (1, 0)  # created, not placed: the device's grace
    page = await lab.store.list_tasks(status=TaskStatus.QUEUED, limit=100)
    reasons = {t.name: t.pending_reason or "" for t in page.tasks}
    assert reasons["user"].startswith("devices_quarantined: "), reasons
    assert reasons["health:adb"].startswith("device_grace: "), reasons
    assert (await lab.store.get_task(user)).pending_reason == reasons["user"]
